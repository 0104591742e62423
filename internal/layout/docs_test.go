package layout_test

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// repoRoot is the repository's root seen from this package's directory,
// where go test runs.
const repoRoot = "../.."

// readmeMaxLines keeps the README a front page: what inboxmill is, the
// guarantee, the first commands and where to read on. Everything else
// belongs on a page under docs/.
const readmeMaxLines = 300

// TestReadmeIsShort fails when the README grows past a front page.
func TestReadmeIsShort(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	require.NoError(t, err)
	n := strings.Count(string(b), "\n")
	if !strings.HasSuffix(string(b), "\n") {
		n++
	}
	assert.LessOrEqual(t, n, readmeMaxLines,
		"README.md has %d lines; move the detail to a page under docs/ and link to it", n)
}

// TestDocLinks checks every relative link and image of README.md and
// docs/*.md: the file it names must exist in the repository, and a
// #fragment — on another page or on the same one — must name a heading of
// the Markdown file it points into, by GitHub's anchor rules. A page
// renamed or a heading reworded breaks links silently on GitHub; here it
// fails with the list of what broke. Links to other sites are not
// fetched, and links inside code (fenced blocks, `code spans`) are not
// links.
func TestDocLinks(t *testing.T) {
	anchorsOf := map[string]map[string]bool{} // repository path -> anchors
	anchors := func(path string) map[string]bool {
		if a, ok := anchorsOf[path]; ok {
			return a
		}
		b, err := os.ReadFile(filepath.Join(repoRoot, path))
		require.NoError(t, err)
		a := mdAnchors(string(b))
		anchorsOf[path] = a
		return a
	}

	var broken []string
	pages := docPages(t)
	for _, page := range pages {
		b, err := os.ReadFile(filepath.Join(repoRoot, page))
		require.NoError(t, err)
		for _, l := range mdLinks(string(b)) {
			problem := checkLink(page, l.target, anchors)
			if problem != "" {
				broken = append(broken, fmt.Sprintf("%s:%d: (%s) %s", page, l.line, l.target, problem))
			}
		}
	}
	require.NotEmpty(t, pages)
	assert.Empty(t, broken, "broken links:\n%s", strings.Join(broken, "\n"))
}

// TestDocsIndexListsEveryPage: docs/README.md is the way into the docs,
// so a page it does not link to is a page no one finds.
func TestDocsIndexListsEveryPage(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "docs", "README.md"))
	require.NoError(t, err)
	linked := map[string]bool{}
	for _, l := range mdLinks(string(b)) {
		path, _, _ := strings.Cut(l.target, "#")
		linked[filepath.ToSlash(filepath.Join("docs", path))] = true
	}
	for _, page := range docPages(t) {
		if page == "README.md" || page == "docs/README.md" {
			continue
		}
		assert.True(t, linked[page], "docs/README.md does not link to %s", page)
	}
}

// docPages lists the checked pages as repository paths: README.md and
// every docs/*.md.
func docPages(t *testing.T) []string {
	t.Helper()
	matches, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	require.NoError(t, err)
	pages := []string{"README.md"}
	for _, m := range matches {
		rel, err := filepath.Rel(repoRoot, m)
		require.NoError(t, err)
		pages = append(pages, filepath.ToSlash(rel))
	}
	slices.Sort(pages[1:])
	return pages
}

// externalTarget matches a target with a URL scheme (https:, mailto:, …)
// or a protocol-relative one: not a file of the repository.
var externalTarget = regexp.MustCompile(`^([a-zA-Z][a-zA-Z0-9+.-]*:|//)`)

// checkLink returns what is wrong with target, a link on page (both
// repository paths), or "" when nothing is.
func checkLink(page, target string, anchors func(string) map[string]bool) string {
	if externalTarget.MatchString(target) {
		return ""
	}
	path, frag, hasFrag := strings.Cut(target, "#")
	if hasFrag && frag == "" {
		return "empty #fragment"
	}
	var dest string // repository path of the target
	if path == "" {
		dest = page
	} else {
		p, err := url.PathUnescape(path)
		if err != nil {
			return "malformed path: " + err.Error()
		}
		if strings.HasPrefix(p, "/") { // GitHub: relative to the repository's root
			dest = filepath.Clean(strings.TrimPrefix(p, "/"))
		} else {
			dest = filepath.Join(filepath.Dir(page), p)
		}
		dest = filepath.ToSlash(dest)
		if dest == ".." || strings.HasPrefix(dest, "../") {
			return "points outside the repository"
		}
		if _, err := os.Stat(filepath.Join(repoRoot, dest)); err != nil {
			return "no such file: " + dest
		}
	}
	if !hasFrag || !strings.EqualFold(filepath.Ext(dest), ".md") {
		return "" // a fragment of a source file (#L10) is GitHub's, not a heading
	}
	frag, err := url.PathUnescape(frag)
	if err != nil {
		return "malformed fragment: " + err.Error()
	}
	if !anchors(dest)[frag] {
		return fmt.Sprintf("no heading with anchor #%s in %s", frag, dest)
	}
	return ""
}

// mdLink is a link or image target and the line it starts on.
type mdLink struct {
	target string
	line   int
}

var (
	// inlineLink matches [text](target "title") and ![alt](target): text
	// with one level of nested brackets, a target in <angle brackets> or
	// without spaces (with balanced parentheses one level deep), and an
	// optional title.
	inlineLink = regexp.MustCompile(`!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^<>\n]*>|(?:[^\s()]|\([^\s()]*\))*)(?:\s+(?:"[^"]*"|'[^']*'|\([^()]*\)))?\s*\)`)
	// refDefinition matches a reference definition: [name]: target.
	refDefinition = regexp.MustCompile(`(?m)^ {0,3}\[[^\]]+\]:[ \t]*(<[^<>\n]*>|\S+)`)
	// htmlLink matches the target of an <a href> or <img src>.
	htmlLink = regexp.MustCompile(`(?i)<(?:a|img)\s[^>]*?\b(?:href|src)\s*=\s*"([^"]*)"`)
)

// mdLinks returns the targets of the links and images in src, outside
// code: inline links, reference definitions and HTML <a href>/<img src>.
func mdLinks(src string) []mdLink {
	text := stripCode(src)
	var links []mdLink
	add := func(idx []int) {
		target := strings.TrimSuffix(strings.TrimPrefix(text[idx[2]:idx[3]], "<"), ">")
		if target == "" {
			return
		}
		links = append(links, mdLink{target: target, line: 1 + strings.Count(text[:idx[0]], "\n")})
	}
	for _, re := range []*regexp.Regexp{inlineLink, refDefinition, htmlLink} {
		for _, idx := range re.FindAllStringSubmatchIndex(text, -1) {
			add(idx)
		}
	}
	slices.SortStableFunc(links, func(a, b mdLink) int { return a.line - b.line })
	return links
}

// fence reports whether line opens or closes a fenced code block, and
// with which marker (``` or ~~~, and how many). Fences are recognised
// however deeply they are indented, since a code block inside a list item
// is indented with it.
func fence(line string) (marker string, ok bool) {
	s := strings.TrimLeft(line, " \t")
	for _, c := range []string{"`", "~"} {
		n := len(s) - len(strings.TrimLeft(s, c))
		if n >= 3 {
			return strings.Repeat(c, n), true
		}
	}
	return "", false
}

// stripCode blanks what Markdown shows as code — fenced blocks and inline
// code spans — keeping every newline, so that offsets into the result
// still give line numbers in src. Code spans may cross lines but not
// paragraphs, so they are matched within each paragraph.
func stripCode(src string) string {
	lines := strings.Split(src, "\n")
	var open string // the marker of the fence we are in, if any
	for i, line := range lines {
		marker, isFence := fence(line)
		switch {
		case open != "":
			if isFence && marker[0] == open[0] && len(marker) >= len(open) &&
				strings.TrimSpace(strings.TrimLeft(strings.TrimSpace(line), marker[:1])) == "" {
				open = ""
			}
			lines[i] = ""
		case isFence:
			open = marker
			lines[i] = ""
		}
	}
	paragraphs := strings.Split(strings.Join(lines, "\n"), "\n\n")
	for i, p := range paragraphs {
		paragraphs[i] = stripCodeSpans(p)
	}
	return strings.Join(paragraphs, "\n\n")
}

// stripCodeSpans blanks the code spans of one paragraph: a run of n
// backticks up to the next run of exactly n. A run without its match is
// literal text, as in Markdown.
func stripCodeSpans(p string) string {
	b := []byte(p)
	run := func(i int) int { // length of the backtick run at i
		j := i
		for j < len(b) && b[j] == '`' {
			j++
		}
		return j - i
	}
	for i := 0; i < len(b); {
		if b[i] != '`' {
			i++
			continue
		}
		n := run(i)
		end := -1
		for j := i + n; j < len(b); {
			if b[j] != '`' {
				j++
				continue
			}
			m := run(j)
			if m == n {
				end = j + m
				break
			}
			j += m
		}
		if end < 0 {
			i += n
			continue
		}
		for k := i; k < end; k++ {
			if b[k] != '\n' {
				b[k] = ' '
			}
		}
		i = end
	}
	return string(b)
}

var (
	atxHeading = regexp.MustCompile(`^ {0,3}#{1,6}(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$`)
	// headingLink turns [text](target) and ![alt](target) into their text,
	// which is what GitHub's anchor is made of.
	headingLink = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	htmlTag     = regexp.MustCompile(`<[^>]*>`)
	htmlAnchor  = regexp.MustCompile(`(?i)<a\s[^>]*?\b(?:name|id)\s*=\s*"([^"]*)"`)
)

// mdAnchors returns the anchors GitHub gives the headings of a Markdown
// page (ATX headings, "## Title", outside fenced code), with duplicates
// numbered -1, -2, … in page order, and the names of explicit
// <a name="…"> or <a id="…"> anchors.
func mdAnchors(src string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	var open string
	for line := range strings.Lines(src) {
		line = strings.TrimRight(line, "\r\n")
		if marker, ok := fence(line); ok {
			switch {
			case open == "":
				open = marker
				continue
			case marker[0] == open[0] && len(marker) >= len(open):
				open = ""
				continue
			}
		}
		if open != "" {
			continue
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			anchors[m[1]] = true
		}
		m := atxHeading.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		slug := githubAnchor(m[1])
		if n := seen[slug]; n > 0 {
			anchors[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			anchors[slug] = true
		}
		seen[slug]++
	}
	return anchors
}

// githubAnchor is the anchor GitHub derives from a heading's text: the
// text as rendered (link targets and HTML tags gone), lowercased, every
// character but letters, marks, digits, connector punctuation (the
// underscore), spaces and hyphens dropped, and each space made a hyphen.
// Backticks, colons, slashes and dashes other than the hyphen disappear,
// so "Reserve / complete: effects" becomes "reserve--complete-effects".
func githubAnchor(heading string) string {
	text := headingLink.ReplaceAllString(heading, "$1")
	text = htmlTag.ReplaceAllString(text, "")
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(text)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-', unicode.IsLetter(r), unicode.IsDigit(r), unicode.IsNumber(r),
			unicode.Is(unicode.M, r), unicode.Is(unicode.Pc, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestGitHubAnchor pins the anchor rules against headings whose anchors
// GitHub renders so.
func TestGitHubAnchor(t *testing.T) {
	for heading, want := range map[string]string{
		"What is guaranteed, and what is not":              "what-is-guaranteed-and-what-is-not",
		"Reserve / complete: effects outside the database": "reserve--complete-effects-outside-the-database",
		"Group commit in pgx pipelines (PostgreSQL)":       "group-commit-in-pgx-pipelines-postgresql",
		"What a replay would do: `inboxmill replay`":       "what-a-replay-would-do-inboxmill-replay",
		"Causal reads: `wsrep_sync_wait=1`":                "causal-reads-wsrep_sync_wait1",
		"Fault injection: what the long runs found":        "fault-injection-what-the-long-runs-found",
		"The [parallel](kafka-parallel.md) consumer":       "the-parallel-consumer",
		"Retention — and purge":                            "retention--and-purge",
		"1,000,000 events":                                 "1000000-events",
		"Étape über":                                       "étape-über",
		"  padded  ":                                       "padded",
	} {
		assert.Equal(t, want, githubAnchor(heading), heading)
	}

	anchors := mdAnchors("# Page\n\n## Batches\n\n```sh\n## not a heading\n```\n\n## Batches\n\n### Batches ###\n<a name=\"custom\"></a>\n")
	assert.Equal(t, map[string]bool{"page": true, "batches": true, "batches-1": true, "batches-2": true, "custom": true}, anchors)
}

// TestMarkdownLinks pins what counts as a link: code never does.
func TestMarkdownLinks(t *testing.T) {
	src := strings.Join([]string{
		"See [a](a.md) and ![img](img/x.png \"title\") and [b](<b c.md#d>).", // 1
		"`[not](code.md)` and ``[nor `this`](x.md)`` and [c](c.md#e)",        // 2
		"",                                 // 3
		"```go",                            // 4
		"x := a[i](y)",                     // 5
		"[fenced](f.md)",                   // 6
		"```",                              // 7
		"  ~~~~",                           // 8
		"[tilde](t.md)",                    // 9
		"  ~~~~",                           // 10
		"[split",                           // 11
		"text](split.md) [paren](f(x).md)", // 12
		"[ref]: ref.md",                    // 13
		`<img src="html.png"> [web](https://example.com) [mail](mailto:a@b)`, // 14
		"an unmatched ` backtick [d](d.md)",                                  // 15
	}, "\n")
	var got []string
	for _, l := range mdLinks(src) {
		got = append(got, fmt.Sprintf("%d %s", l.line, l.target))
	}
	assert.Equal(t, []string{
		"1 a.md", "1 img/x.png", "1 b c.md#d",
		"2 c.md#e",
		"11 split.md", "12 f(x).md",
		"13 ref.md",
		"14 https://example.com", "14 mailto:a@b", "14 html.png",
		"15 d.md",
	}, got)
}

// TestCheckLink runs the checker on links that must pass and links that
// must fail, against this repository's own pages.
func TestCheckLink(t *testing.T) {
	anchors := func(path string) map[string]bool {
		b, err := os.ReadFile(filepath.Join(repoRoot, path))
		require.NoError(t, err)
		return mdAnchors(string(b))
	}
	for target, wantOK := range map[string]bool{
		"https://watermill.io":                true,
		"mailto:someone@example.com":          true,
		"docs/README.md":                      true,
		"docs/modes.md#group-commit":          true,
		"docs/modes.md#no-such-heading":       false,
		"docs/no-such-page.md":                false,
		"#what-is-guaranteed-and-what-is-not": true,
		"#nowhere":                            false,
		"#":                                   false,
		"../outside.md":                       false,
		"internal/layout/docs_test.go#L1":     true,
		"/docs/modes.md#transactional-mode":   true,
		"docs/img/console-overview.png":       true,
		"docs/img/console-overview%2Epng":     true,
		"docs/img/no-such-screenshot.png":     false,
	} {
		problem := checkLink("README.md", target, anchors)
		assert.Equal(t, wantOK, problem == "", "%s: %s", target, problem)
	}
}
