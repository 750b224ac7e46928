// keiro console: small progressive enhancements. Every page works without this file.
(function () {
  "use strict";
  document.documentElement.classList.add("js");

  // "Select all" checkboxes in the header of a row table (delegated: the lists are refreshed).
  document.addEventListener("change", function (ev) {
    var all = ev.target;
    if (!all.classList || !all.classList.contains("select-all")) { return; }
    all.closest("table").querySelectorAll("tbody input[type=checkbox]").forEach(function (box) { box.checked = all.checked; });
  });

  document.addEventListener("DOMContentLoaded", function () {
    // Live refresh: the page's #live part is fetched again every data-refresh seconds and
    // replaced in place (?fragment=live answers that part alone). It waits while the operator
    // has rows selected, text selected, or the focus in the list, and while the tab is hidden.
    var live = document.getElementById("live");
    var secs = parseInt(document.body.getAttribute("data-refresh") || "0", 10);
    var toggle = document.getElementById("toggle-refresh");
    if (!live || !secs) { return; }
    var paused = window.localStorage && localStorage.getItem("keiro-console-paused") === "1";
    var timer = null;

    function busy() {
      if (document.hidden) { return true; }
      if (live.querySelector("input[type=checkbox]:checked")) { return true; }
      var sel = window.getSelection && window.getSelection();
      if (sel && sel.toString() !== "") { return true; }
      return live.contains(document.activeElement) && document.activeElement !== live;
    }
    function fragmentURL() {
      var u = new URL(window.location.href);
      u.searchParams.set("fragment", "live");
      return u.toString();
    }
    function refresh() {
      timer = null;
      if (paused) { return; }
      if (busy()) { arm(); return; }
      fetch(fragmentURL(), { credentials: "same-origin", headers: { "Accept": "text/html" } })
        .then(function (resp) { return resp.ok ? resp.text() : null; })
        .then(function (html) {
          if (html !== null && !busy()) {
            live.innerHTML = html;
            document.body.setAttribute("data-refreshed", String(Date.now()));
          }
        })
        .catch(function () { /* the next round tries again */ })
        .then(arm);
    }
    function arm() { if (!paused && !timer) { timer = setTimeout(refresh, secs * 1000); } }
    function label() { if (toggle) { toggle.textContent = paused ? "resume" : "pause"; } }
    if (toggle) {
      toggle.addEventListener("click", function (ev) {
        ev.preventDefault();
        paused = !paused;
        if (window.localStorage) { localStorage.setItem("keiro-console-paused", paused ? "1" : "0"); }
        if (timer) { clearTimeout(timer); timer = null; }
        label(); arm();
      });
    }
    label(); arm();
  });
})();
