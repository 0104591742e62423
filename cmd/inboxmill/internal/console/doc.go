// Package console is inboxmill's web console: a small set of
// server-rendered pages over an [inbox.Store], mounted by `inboxmill
// serve`.
//
// # Pages
//
// The overview counts records by status and operation and shows the
// oldest pending record, the oldest processing record whose lease has
// expired and the records awaiting purge. The record list filters by
// status, operation, scope, age and attempt and pages with the store's
// cursor. A record's page shows every column, its lease and its audit
// history, with forms to resolve it (pending, or processing under an
// expired lease) or forget it; both need a reason and land in the audit
// trail, which has a page of its own. A forget asks for confirmation on a
// page of its own before it deletes anything. /metrics serves Prometheus gauges
// read from [inbox.Store.Overview], at most once per
// [Config.MetricsMaxAge] however many scrapers ask; /healthz pings the
// database.
//
// # Security
//
// The console binds where its caller says; [CheckBind] refuses a
// non-loopback address without a token, and [CheckBind] and [New] refuse
// a token shorter than [MinTokenLen] bytes wherever it listens.
// Without a token it answers only requests whose Host is a loopback name
// (localhost, 127.0.0.0/8, [::1]) or one of [Config.AllowedHosts], and 421
// to others, so that a page on another site cannot reach it by rebinding
// its own name to 127.0.0.1. Whatever a browser says another site's page
// sent (Sec-Fetch-Site: cross-site) is refused, but for a link followed
// to a page, the stylesheet and /healthz. With [Config.Token] set, every
// page, form and /metrics needs it, as a bearer token or through the
// login form's login cookie (HttpOnly, SameSite=Strict, signed with a
// secret that lives only in this process, and naming a session that
// logging out ends on the server). Wrong tokens from one client lock it
// out for a while ([Config.LoginFailures], [Config.LoginLockout]). Every state-changing request
// is a POST that must carry a CSRF token (a signed double-submit token:
// cookie and form field, compared in constant time) and come from the
// console's own origin: Sec-Fetch-Site same-origin or, from a browser
// that sends no Sec-Fetch-Site, an Origin header whose host is the
// request's Host ([http.CrossOriginProtection]). Cookies do not keep the
// ports of one host apart, so the origin check is what stops a page on
// another port that planted a CSRF token it fetched. Pages are rendered
// with html/template, so keys, scopes and errors are always escaped, and
// they load no script; the Content-Security-Policy forbids scripts,
// framing and foreign origins. Record links carry the record's ID in the
// query string (Referrer-Policy no-referrer keeps them on this site); the
// console's own log lines name records by key digest only and never carry
// reasons, payloads or tokens.
//
// # Usage
//
//	if err := console.CheckBind(addr, token); err != nil { ... }
//	h, err := console.New(console.Config{Store: store, Token: token, Logger: logger})
//	if err != nil { ... }
//	srv := &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: 10 * time.Second}
package console
