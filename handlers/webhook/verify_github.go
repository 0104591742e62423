package webhook

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Headers of GitHub's webhook deliveries.
const (
	GitHubSignatureHeader = "X-Hub-Signature-256"
	GitHubDeliveryHeader  = "X-GitHub-Delivery"
	GitHubEventHeader     = "X-GitHub-Event"
)

// GitHub verifies GitHub's webhook signatures: an X-Hub-Signature-256
// header "sha256=<hex>" holding HMAC-SHA256 over the body keyed by the
// webhook's secret. The event ID is the X-GitHub-Delivery GUID (the same
// when a delivery is redelivered), the type is X-GitHub-Event, and the
// tenant is the GitHub App installation ("installation.id" in a JSON body)
// when there is one. The legacy SHA-1 header X-Hub-Signature is not
// accepted.
//
// GitHub signs the body only, with no timestamp: the delivery and event
// headers are not covered by the signature, and nothing bounds a replay.
// Someone holding one captured delivery (body and signature) can send it
// again under another X-GitHub-Delivery, which the inbox sees as a new
// event. Keep the endpoint on TLS and the requests out of logs.
type GitHub struct {
	// Secrets are the webhook's secrets. GitHub holds one secret per
	// webhook; list the new one next to the old while you change it in
	// GitHub's settings, and remove the old one afterwards. At least one is
	// required.
	Secrets []string
}

// GitHubVerifier returns a GitHub verifier for the webhook's secrets (more
// than one during a rotation).
func GitHubVerifier(secrets ...string) *GitHub {
	return &GitHub{Secrets: secrets}
}

func (v *GitHub) validate() error {
	if v == nil {
		return fmt.Errorf("%w: nil *GitHub verifier", ErrInvalidConfig)
	}
	return validateSecrets("GitHubVerifier", v.Secrets, 0)
}

// Verify checks X-Hub-Signature-256 against the body and reads the delivery
// ID, event type and installation.
func (v *GitHub) Verify(r *http.Request, body []byte, _ time.Time) (Event, error) {
	header := r.Header.Get(GitHubSignatureHeader)
	if header == "" {
		return Event{}, fmt.Errorf("%w: no %s header", ErrMissingSignature, GitHubSignatureHeader)
	}
	sig, err := parsePrefixedHex(header, "sha256=", sha256.Size)
	if err != nil {
		return Event{}, fmt.Errorf("%w: %s is not sha256=<64 hex digits>", err, GitHubSignatureHeader)
	}
	if !anyMAC(sha256.New, stringKeys(v.Secrets), [][]byte{sig}, body) {
		return Event{}, fmt.Errorf("%w: %s does not match", ErrSignatureMismatch, GitHubSignatureHeader)
	}
	id := r.Header.Get(GitHubDeliveryHeader)
	if err := checkEventID(id); err != nil {
		return Event{}, fmt.Errorf("%w (%s header)", err, GitHubDeliveryHeader)
	}
	return Event{ID: id, Type: r.Header.Get(GitHubEventHeader), Tenant: githubInstallation(body), Provider: "github"}, nil
}

// parsePrefixedHex decodes "<prefix><hex>" of exactly size bytes.
func parsePrefixedHex(s, prefix string, size int) ([]byte, error) {
	rest, ok := strings.CutPrefix(s, prefix)
	if !ok {
		return nil, ErrMalformedHeader
	}
	sig, err := hex.DecodeString(rest)
	if err != nil || len(sig) != size {
		return nil, ErrMalformedHeader
	}
	return sig, nil
}

// githubInstallation returns a JSON body's installation.id, or "" (a
// repository or organization webhook, or a form-encoded body).
func githubInstallation(body []byte) string {
	if b := bytes.TrimLeft(body, " \t\r\n"); len(b) == 0 || b[0] != '{' {
		return ""
	}
	var p struct {
		Installation *struct {
			ID json.Number `json:"id"`
		} `json:"installation"`
	}
	if json.Unmarshal(body, &p) != nil || p.Installation == nil {
		return ""
	}
	return p.Installation.ID.String()
}
