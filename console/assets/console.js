// keiro console: small progressive enhancements. Every page works without this file.
(function () {
  "use strict";
  document.documentElement.classList.add("js");
  document.addEventListener("DOMContentLoaded", function () {
    // "Select all" checkboxes in the header of a row table.
    document.querySelectorAll("input.select-all").forEach(function (all) {
      all.addEventListener("change", function () {
        var table = all.closest("table");
        table.querySelectorAll("tbody input[type=checkbox]").forEach(function (box) { box.checked = all.checked; });
      });
    });
    // Auto-refresh of the overview, pausable; the choice is remembered.
    var body = document.body, secs = parseInt(body.getAttribute("data-refresh") || "0", 10);
    var toggle = document.getElementById("toggle-refresh");
    if (!secs) { return; }
    var paused = window.localStorage && localStorage.getItem("keiro-console-paused") === "1";
    var timer = null;
    function arm() { timer = paused ? null : setTimeout(function () { location.reload(); }, secs * 1000); }
    function label() { if (toggle) { toggle.textContent = paused ? "resume" : "pause"; } }
    if (toggle) {
      toggle.addEventListener("click", function (ev) {
        ev.preventDefault();
        paused = !paused;
        if (window.localStorage) { localStorage.setItem("keiro-console-paused", paused ? "1" : "0"); }
        if (timer) { clearTimeout(timer); }
        label(); arm();
      });
    }
    label(); arm();
  });
})();
