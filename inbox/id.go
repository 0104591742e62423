package inbox

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Limits on the identifying columns and the lease owner, in bytes. They are
// what the MySQL schema can index (VARBINARY(255)); the other dialects
// enforce the same limits so that a store can move between databases.
const (
	MaxScopeLen     = 255
	MaxOperationLen = 255
	MaxKeyLen       = 255
	MaxOwnerLen     = 255
	// MaxPayloadHashLen bounds a payload fingerprint (SHA-512 fits).
	MaxPayloadHashLen = 64
)

// ID identifies one business intent: the tenant or security scope, what is
// done, and the business event's own key. It is the inbox table's primary
// key. Scope may be empty (one global scope); Operation and Key may not.
type ID struct {
	Scope     string
	Operation string
	Key       string
}

// Validate checks id against the limits every dialect shares: valid UTF-8
// without NUL bytes, within MaxScopeLen, MaxOperationLen and MaxKeyLen, and
// a non-empty operation and key. Errors wrap [ErrInvalidKey].
func (id ID) Validate() error {
	var errs []error
	check := func(name, v string, max int, required bool) {
		switch {
		case required && v == "":
			errs = append(errs, fmt.Errorf("%w: %s is empty", ErrInvalidKey, name))
		default:
			if err := CheckText(v, max); err != nil {
				errs = append(errs, fmt.Errorf("%w: %s %w", ErrInvalidKey, name, err))
			}
		}
	}
	check("scope", id.Scope, MaxScopeLen, false)
	check("operation", id.Operation, MaxOperationLen, true)
	check("key", id.Key, MaxKeyLen, true)
	return errors.Join(errs...)
}

// CheckText reports why s cannot be stored in a text column that every
// dialect accepts the same way: it must be valid UTF-8 (PostgreSQL refuses
// anything else, MySQL mangles it), hold no NUL byte (PostgreSQL refuses
// it) and be at most max bytes long (max < 0: no limit). The error reads
// as a predicate ("is 300 bytes, more than 255").
func CheckText(s string, max int) error {
	switch {
	case max >= 0 && len(s) > max:
		return fmt.Errorf("is %d bytes, more than %d", len(s), max)
	case !utf8.ValidString(s):
		return errors.New("is not valid UTF-8")
	case containsNUL(s):
		return errors.New("contains a NUL byte")
	}
	return nil
}

func containsNUL(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return true
		}
	}
	return false
}

// sum hashes the three parts, each terminated by a NUL byte: a NUL cannot
// occur inside a valid part, so distinct IDs never hash the same input.
func (id ID) sum() [sha256.Size]byte {
	var buf [256]byte // most IDs fit: no allocation
	b := append(buf[:0], id.Scope...)
	b = append(b, 0)
	b = append(b, id.Operation...)
	b = append(b, 0)
	b = append(b, id.Key...)
	b = append(b, 0)
	return sha256.Sum256(b)
}

// Digest returns a short, stable digest of id that is safe to log (16 hex
// characters): keys can carry customer data, digests cannot be read back.
// Log lines carry it as key_digest, and operator tools find a record by it.
func (id ID) Digest() string {
	s := id.sum()
	var buf [16]byte
	hex.Encode(buf[:], s[:8])
	return string(buf[:])
}

// IdempotencyKey returns a key that is stable for every attempt of the
// intent and safe to send to a provider as its idempotency key: 64 hex
// characters, the SHA-256 of scope, operation and key. Its first 16
// characters are the [ID.Digest].
func (id ID) IdempotencyKey() string {
	s := id.sum()
	var buf [2 * sha256.Size]byte
	hex.Encode(buf[:], s[:])
	return string(buf[:])
}

// String returns the digest form, "operation/digest", so that an ID
// printed by accident does not leak its key. An operation holding a
// character that is not printable (a terminal escape, a newline) is
// quoted, so that printing an ID cannot drive the terminal it lands on;
// so is one holding bytes that are not UTF-8 (0x9b starts a control
// sequence on a terminal that reads Latin-1).
func (id ID) String() string {
	op := id.Operation
	if !utf8.ValidString(op) || strings.IndexFunc(op, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		op = strconv.Quote(op)
	}
	return op + "/" + id.Digest()
}

// NewOwnerID returns a lease owner name unique to this process:
// "<prefix>-<hostname>-<pid>-<random>", cut to MaxOwnerLen bytes (from the
// front: the random part is what tells two owners apart). An empty prefix
// is left out.
func NewOwnerID(prefix string) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "host"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	owner := fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	if prefix != "" {
		owner = prefix + "-" + owner
	}
	if len(owner) > MaxOwnerLen {
		owner = owner[len(owner)-MaxOwnerLen:]
	}
	if !utf8.ValidString(owner) {
		// A cut through a multi-byte host name: drop the partial rune.
		owner = string([]rune(owner)[1:])
	}
	return owner
}
