package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/inboxmill/inboxmill/inbox"
)

// action is one submitted resolve or forget form.
type action struct {
	name    string // "resolve" or "forget"
	id      inbox.ID
	attempt int64
	actor   inbox.Actor
	dryRun  bool
	// confirmed: the form is a confirmation page's, which a forget that
	// is not a dry run must be.
	confirmed bool
	form      actionForm
}

// readAction checks the request and reads the form every action shares.
// It answers the request itself and returns false when the action must
// not run.
func (h *handler) readAction(w http.ResponseWriter, r *http.Request, name string) (action, bool) {
	a := action{name: name}
	if h.cfg.ReadOnly {
		h.log.Info("console "+name+" refused: read-only", "remote", r.RemoteAddr)
		h.actions.WithLabelValues(name, "refused").Inc()
		h.render(w, r, http.StatusForbidden, "error", &view{Title: "Read-only", Error: "This console is read-only: it changes nothing."})
		return a, false
	}
	if !h.readForm(w, r) {
		h.actions.WithLabelValues(name, "refused").Inc()
		return a, false
	}
	if !h.checkCSRF(r) {
		h.actions.WithLabelValues(name, "refused").Inc()
		h.forbidden(w, r)
		return a, false
	}
	f := r.PostForm
	a.id = inbox.ID{Scope: f.Get("scope"), Operation: f.Get("operation"), Key: f.Get("key")}
	a.form = actionForm{To: f.Get("to"), Reason: f.Get("reason"), Actor: f.Get("actor"),
		ExternalRef: f.Get("external_ref")}
	switch mode := f.Get("mode"); mode {
	case "dry-run":
		a.dryRun = true
	case "", "apply": // "": a client that posts the form without pressing a button
	default:
		h.actions.WithLabelValues(name, "refused").Inc()
		h.badInput(w, r, fmt.Sprintf("The form's mode %q is neither dry-run nor apply: nothing was changed.", mode))
		return a, false
	}
	a.actor = inbox.Actor{Name: strings.TrimSpace(a.form.Actor), Reason: strings.TrimSpace(a.form.Reason)}
	if a.actor.Name == "" {
		a.actor.Name = h.cfg.Actor
	}
	switch confirm := f.Get("confirm"); confirm {
	case "yes":
		a.confirmed = true
	case "":
	default:
		h.actions.WithLabelValues(name, "refused").Inc()
		h.badInput(w, r, fmt.Sprintf("The form's confirm %q is not yes: nothing was changed.", confirm))
		return a, false
	}
	if err := a.id.Validate(); err != nil {
		h.render(w, r, http.StatusBadRequest, "error", &view{Title: "Bad request", Error: "The form does not name a record: " + err.Error()})
		return a, false
	}
	var errs []error
	if s := f.Get("attempt"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			errs = append(errs, fmt.Errorf("attempt %q is not a whole number", s))
		}
		a.attempt = n
	}
	switch {
	case a.actor.Reason == "":
		errs = append(errs, errors.New("a reason is required: say why, for whoever reads the audit trail"))
	case len(a.actor.Reason) > inbox.MaxReasonLen:
		errs = append(errs, fmt.Errorf("the reason is %d bytes, more than %d", len(a.actor.Reason), inbox.MaxReasonLen))
	}
	if len(a.actor.Name) > inbox.MaxActorLen {
		errs = append(errs, fmt.Errorf("the actor is %d bytes, more than %d", len(a.actor.Name), inbox.MaxActorLen))
	}
	if name == "resolve" {
		if to := inbox.Status(a.form.To); to != inbox.StatusCompleted && to != inbox.StatusFailed {
			errs = append(errs, errors.New("resolve to completed or failed"))
		}
	}
	if err := errors.Join(errs...); err != nil {
		h.actions.WithLabelValues(name, "refused").Inc()
		h.showRecord(w, r, a.id, nil, http.StatusBadRequest, &view{Error: err.Error(), Data: recordView{Form: a.form}})
		return a, false
	}
	return a, true
}

func (h *handler) resolve(w http.ResponseWriter, r *http.Request) {
	a, ok := h.readAction(w, r, "resolve")
	if !ok {
		return
	}
	ctx, cancel := h.ctx(r)
	defer cancel()
	before, after, err := h.store.Resolve(ctx, inbox.ResolveParams{
		ID: a.id, To: inbox.Status(a.form.To), Attempt: a.attempt, Actor: a.actor, DryRun: a.dryRun,
		ExternalRef: strings.TrimSpace(a.form.ExternalRef),
	})
	if err != nil {
		h.actionFailed(w, r, a, err)
		return
	}
	h.logAction(a, "from", before.Status, "to", after.Status, "attempt", before.Attempt)
	if a.dryRun {
		h.actions.WithLabelValues(a.name, "dry_run").Inc()
		h.showRecord(w, r, a.id, before, http.StatusOK, &view{Data: recordView{Form: a.form},
			Notice: fmt.Sprintf("Dry run: resolving would move this record from %s (attempt %d) to %s. Nothing was changed.",
				before.Status, before.Attempt, after.Status)})
		return
	}
	h.actions.WithLabelValues(a.name, "applied").Inc()
	http.Redirect(w, r, recordURL(a.id)+"&done=resolved", http.StatusSeeOther)
}

func (h *handler) forget(w http.ResponseWriter, r *http.Request) {
	a, ok := h.readAction(w, r, "forget")
	if !ok {
		return
	}
	ctx, cancel := h.ctx(r)
	defer cancel()
	if !a.dryRun && !a.confirmed {
		h.confirmForget(w, r, ctx, a)
		return
	}
	rec, err := h.store.Forget(ctx, inbox.ForgetParams{ID: a.id, Attempt: a.attempt, Actor: a.actor, DryRun: a.dryRun})
	if err != nil {
		h.actionFailed(w, r, a, err)
		return
	}
	h.logAction(a, "from", rec.Status, "attempt", rec.Attempt)
	if a.dryRun {
		h.actions.WithLabelValues(a.name, "dry_run").Inc()
		h.showRecord(w, r, a.id, rec, http.StatusOK, &view{Data: recordView{Form: a.form},
			Notice: fmt.Sprintf("Dry run: forgetting would delete this %s record (attempt %d), and the next delivery of its message would run the handler again. Nothing was changed.",
				rec.Status, rec.Attempt)})
		return
	}
	h.actions.WithLabelValues(a.name, "applied").Inc()
	http.Redirect(w, r, "/audit?"+url.Values{"done": {"forgotten"}}.Encode(), http.StatusSeeOther)
}

// confirmView is the page that asks before a forget.
type confirmView struct {
	ID      inbox.ID
	Record  *inbox.Record
	Attempt int64 // the attempt the confirmed forget is fenced to
	Form    actionForm
	Back    string
}

// confirmForget answers a forget that is not confirmed yet: it checks
// the forget as a dry run would, and shows what it would delete with a
// form of its own that confirms it. Nothing changes until that form is
// sent; the attempt it carries is the one checked here, so that a record
// a worker took over meanwhile is refused, not deleted.
func (h *handler) confirmForget(w http.ResponseWriter, r *http.Request, ctx context.Context, a action) {
	rec, err := h.store.Forget(ctx, inbox.ForgetParams{ID: a.id, Attempt: a.attempt, Actor: a.actor, DryRun: true})
	if err != nil {
		h.actionFailed(w, r, a, err)
		return
	}
	h.log.Info("console forget asked for confirmation", "operation", a.id.Operation, "key_digest", a.id.Digest(), "attempt", rec.Attempt)
	h.render(w, r, http.StatusOK, "confirm", &view{Title: "Forget record " + a.id.Digest() + "?", Nav: "records",
		Data: confirmView{ID: a.id, Record: rec, Attempt: rec.Attempt, Form: a.form, Back: recordURL(a.id)}})
}

// logAction writes the action's line: the record by operation and digest,
// never its key, and not the reason (free text an operator may paste
// anything into).
func (h *handler) logAction(a action, attrs ...any) {
	attrs = append([]any{"operation", a.id.Operation, "key_digest", a.id.Digest(), "actor", a.actor.Name, "dry_run", a.dryRun}, attrs...)
	h.log.Info("console "+a.name, attrs...)
}

// actionFailed shows the record again with what the store refused, keeping
// the form's input.
func (h *handler) actionFailed(w http.ResponseWriter, r *http.Request, a action, err error) {
	status, msg := http.StatusInternalServerError, ""
	switch {
	case errors.Is(err, inbox.ErrNotFound):
		status, msg = http.StatusNotFound, "There is no such record any more: it was forgotten or purged."
	case errors.Is(err, inbox.ErrLeaseLive):
		status, msg = http.StatusConflict, "A worker holds this record under a live lease. Nothing was changed; wait until it finishes or its lease expires."
	case errors.Is(err, inbox.ErrLeaseLost):
		status, msg = http.StatusConflict, "The record changed since this page was loaded (a worker took it over or finished it). Nothing was changed; check it again below."
	case errors.Is(err, inbox.ErrNotResolvable):
		status, msg = http.StatusConflict, "Only a pending record, or a processing record whose lease has expired, can be resolved. Nothing was changed."
	case errors.Is(err, inbox.ErrInvalidParams), errors.Is(err, inbox.ErrInvalidKey):
		status, msg = http.StatusBadRequest, err.Error()
	case errors.Is(err, inbox.ErrSchemaOutdated):
		msg = "The inbox has no audit table yet. Run `inboxmill migrate`."
	default:
		msg = "The database failed; nothing was changed. The console's log has the error."
	}
	result := "refused"
	if status == http.StatusInternalServerError {
		result = "error"
		h.log.Error("console "+a.name+" failed", "operation", a.id.Operation, "key_digest", a.id.Digest(), "error", err)
	} else {
		h.log.Info("console "+a.name+" refused", "operation", a.id.Operation, "key_digest", a.id.Digest(), "status", status, "error", err)
	}
	h.actions.WithLabelValues(a.name, result).Inc()
	h.showRecord(w, r, a.id, nil, status, &view{Error: msg, Data: recordView{Form: a.form}})
}
