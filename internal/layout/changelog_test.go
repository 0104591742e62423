package layout_test

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var (
	releaseHeading = regexp.MustCompile(`^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$`)
	linkRef        = regexp.MustCompile(`^\[([^\]]+)\]: https://\S+$`)
)

// TestChangelog: CHANGELOG.md keeps the Keep a Changelog shape: an
// [Unreleased] section first, then one dated section per release, newest
// first, each with its link; and every release tag of the repository has
// its section (a tag cut without one, or a section without its tag, fails).
func TestChangelog(t *testing.T) {
	b, err := os.ReadFile("../../CHANGELOG.md")
	require.NoError(t, err)
	var (
		sections []string
		links    = map[string]bool{}
		last     time.Time
	)
	for line := range strings.Lines(string(b)) {
		line = strings.TrimRight(line, "\n")
		if m := linkRef.FindStringSubmatch(line); m != nil {
			links[m[1]] = true
			continue
		}
		if !strings.HasPrefix(line, "## ") {
			continue
		}
		if line == "## [Unreleased]" {
			require.Empty(t, sections, "[Unreleased] comes first")
			sections = append(sections, "Unreleased")
			continue
		}
		m := releaseHeading.FindStringSubmatch(line)
		require.NotNil(t, m, "release heading %q: want ## [X.Y.Z] - YYYY-MM-DD", line)
		day, err := time.Parse(time.DateOnly, m[2])
		require.NoError(t, err, line)
		require.False(t, !last.IsZero() && day.After(last), "%s: releases go newest first", line)
		last = day
		sections = append(sections, m[1])
	}
	require.NotEmpty(t, sections)
	require.Equal(t, "Unreleased", sections[0], "[Unreleased] comes first")
	for _, s := range sections {
		require.True(t, links[s], "section %s has no link reference", s)
	}

	out, err := exec.Command("git", "-C", "../..", "tag", "--list", "v*").Output()
	if err != nil {
		t.Logf("no git tags to compare (%v)", err)
		return
	}
	released := map[string]bool{}
	for _, s := range sections[1:] {
		released["v"+s] = true
	}
	for tag := range strings.FieldsSeq(string(out)) {
		require.True(t, released[tag], "tag %s has no section in CHANGELOG.md", tag)
	}
}
