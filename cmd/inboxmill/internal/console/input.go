package console

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"
)

// Reading a request's input. A query string or a form that does not
// parse is refused rather than half read (url.Values drops what it cannot
// decode), and so is a parameter given more than once: which copy would
// count is a guess, and on a form that changes a record a wrong guess
// changes the wrong thing.

// query returns r's query parameters, or answers 400 and returns false
// when the query does not parse or repeats a parameter.
func (h *handler) query(w http.ResponseWriter, r *http.Request) (url.Values, bool) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err == nil {
		err = repeated(q)
	}
	if err != nil {
		h.badInput(w, r, "This link's query string is not one the console reads: "+err.Error())
		return nil, false
	}
	return q, true
}

// readForm parses a POST's form, bounded to maxFormBytes: 413 for a larger
// body, 400 for one that does not parse or repeats a field. It returns
// false when it answered.
func (h *handler) readForm(w http.ResponseWriter, r *http.Request) bool {
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	err := r.ParseForm()
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		h.log.Info("console request refused: form too large", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr)
		h.render(w, r, http.StatusRequestEntityTooLarge, "error", &view{Title: "Too large",
			Error: fmt.Sprintf("This form is too large: a form sent to the console has at most %d KiB.", maxFormBytes>>10)})
		return false
	case err == nil:
		err = repeated(r.PostForm)
	}
	if err != nil {
		h.badInput(w, r, "This form is not one the console reads: "+err.Error())
		return false
	}
	return true
}

// repeated reports the parameters of v given more than once.
func repeated(v url.Values) error {
	var names []string
	for k, vs := range v {
		if len(vs) > 1 {
			names = append(names, fmt.Sprintf("%q", k))
		}
	}
	if len(names) == 0 {
		return nil
	}
	sort.Strings(names)
	return fmt.Errorf("%s given more than once", strings.Join(names, ", "))
}

func (h *handler) badInput(w http.ResponseWriter, r *http.Request, msg string) {
	h.log.Info("console request refused: bad input", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr)
	h.render(w, r, http.StatusBadRequest, "error", &view{Title: "Bad request", Error: msg})
}
