package console

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/keiro-go/keiro/events"
)

// Sagas answers GET /api/v1/sagas: what the routers, process managers and durable timers of
// the event store set aside — the commands they dead-lettered (RejectedDeadLetter), newest
// first, and the timers due and firing, with the firing ones listed oldest claim first (a
// worker died or a fire keeps failing until a worker requeues them). Read-only: a dispatch
// dead letter is replayed by the service that runs the router or process manager (its
// Dispatch with the row's source event), and `relay events timers requeue|cancel` repairs a
// timer.
type Sagas struct {
	// DeadLetters are the dispatch dead letters, newest first.
	DeadLetters []events.DispatchDeadLetter `json:"dead_letters"`
	// DeadLettersMore reports that more dead letters exist than were listed.
	DeadLettersMore bool `json:"dead_letters_more,omitempty"`
	// TimersDue counts the scheduled timers already due (keiro.timer.backlog).
	TimersDue int64 `json:"timers_due"`
	// TimersFiring counts the firing timers (keiro.timer.stuck).
	TimersFiring int64 `json:"timers_firing"`
	// Firing are the firing timers, oldest claim first.
	Firing []events.Timer `json:"firing"`
	// FiringMore reports that more firing timers exist than were listed.
	FiringMore bool `json:"firing_more,omitempty"`
	// ReadAt is when the answer was read.
	ReadAt time.Time `json:"read_at"`
}

// sagasFilter is the query of GET /api/v1/sagas and its page.
type sagasFilter struct {
	Dispatcher string
	Limit      int
}

func parseSagasFilter(r *http.Request) (sagasFilter, error) {
	f := sagasFilter{Dispatcher: strings.TrimSpace(r.URL.Query().Get("dispatcher"))}
	var err error
	f.Limit, err = pageSize(r)
	return f, err
}

func (c *Console) readSagas(ctx context.Context, f sagasFilter) (Sagas, error) {
	pool := c.cfg.Events.Pool
	out := Sagas{DeadLetters: []events.DispatchDeadLetter{}, Firing: []events.Timer{}, ReadAt: time.Now().UTC()}
	dead, err := c.events.ListDispatchDeadLetters(ctx, pool, f.Dispatcher, f.Limit+1)
	if err != nil {
		return out, err
	}
	if len(dead) > f.Limit {
		dead, out.DeadLettersMore = dead[:f.Limit], true
	}
	out.DeadLetters = append(out.DeadLetters, dead...)
	counts, err := c.events.CountTimers(ctx, pool, out.ReadAt)
	if err != nil {
		return out, err
	}
	out.TimersDue, out.TimersFiring = counts.Due, counts.Firing
	firing, err := c.events.FindStuckTimers(ctx, pool, out.ReadAt, events.StuckTimerFilter{Limit: f.Limit + 1})
	if err != nil {
		return out, err
	}
	if len(firing) > f.Limit {
		firing, out.FiringMore = firing[:f.Limit], true
	}
	out.Firing = append(out.Firing, firing...)
	return out, nil
}

// sagasData is the sagas page's content.
type sagasData struct {
	Filter sagasFilter
	Sagas  Sagas
}

func (c *Console) pageSagas(w http.ResponseWriter, r *http.Request) {
	f, err := parseSagasFilter(r)
	if err != nil {
		c.pageError(w, r, http.StatusBadRequest, err.Error())
		return
	}
	s, err := c.readSagas(r.Context(), f)
	if err != nil {
		c.serverError(w, r, err)
		return
	}
	c.render(w, r, http.StatusOK, "sagas", "Routers, process managers and timers", "subscriptions", sagasData{Filter: f, Sagas: s})
}
