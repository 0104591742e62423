package migrationfiles

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"slices"
	"strings"
)

// AtlasSumName is the name of Atlas's integrity file.
const AtlasSumName = "atlas.sum"

// atlasSum computes atlas.sum for files, in Atlas's format: a line
// "h1:<sum>", then one line "<name> h1:<hash>" per file in name order.
// A file's hash is the base64 of SHA-256 over the names and contents of
// every file up to and including it, so that each line also pins the
// order; the sum is the base64 of SHA-256 over every name and hash.
func atlasSum(files []File) []byte {
	names := make([]string, len(files))
	bodies := map[string][]byte{}
	for i, f := range files {
		names[i] = f.Name
		bodies[f.Name] = f.Body
	}
	slices.Sort(names) // Atlas reads a directory's files in byte order
	running, total := sha256.New(), sha256.New()
	var lines strings.Builder
	for _, n := range names {
		running.Write([]byte(n))
		running.Write(bodies[n])
		h := base64.StdEncoding.EncodeToString(running.Sum(nil))
		total.Write([]byte(n))
		total.Write([]byte(h))
		fmt.Fprintf(&lines, "%s h1:%s\n", n, h)
	}
	return []byte("h1:" + base64.StdEncoding.EncodeToString(total.Sum(nil)) + "\n" + lines.String())
}
