package check

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The documentation names the tests that prove each guarantee. Every test
// it names must exist, or the docs would cite proof that is gone.
func TestDocsCiteTestsThatExist(t *testing.T) {
	defined := map[string]bool{}
	funcRe := regexp.MustCompile(`(?m)^func ((?:Test|Benchmark|Fuzz)[A-Za-z0-9_]+)\(`)
	citeRe := regexp.MustCompile(`\b((?:Test|Fuzz)[A-Z][A-Za-z0-9_]+)\b`)
	var docs []string
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == ".demo" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		switch {
		case strings.HasSuffix(path, "_test.go"):
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range funcRe.FindAllStringSubmatch(string(b), -1) {
				defined[m[1]] = true
			}
		case strings.HasSuffix(path, ".md"):
			docs = append(docs, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	cited := 0
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		for _, m := range citeRe.FindAllStringSubmatchIndex(text, -1) {
			name := text[m[2]:m[3]]
			if name == "TestMain" || strings.HasSuffix(name, "Test") {
				continue
			}
			cited++
			if m[3] < len(text) && text[m[3]] == '*' { // TestShutdown*: a family of tests
				if !hasPrefix(defined, name) {
					rel, _ := filepath.Rel(root, doc)
					t.Errorf("%s cites %s*, and no test has that prefix", rel, name)
				}
				continue
			}
			if !defined[name] {
				rel, _ := filepath.Rel(root, doc)
				t.Errorf("%s cites %s, which no _test.go file defines", rel, name)
			}
		}
	}
	if cited < 50 {
		t.Errorf("the docs cite only %d tests; the guarantees table alone cites more", cited)
	}
}

func hasPrefix(names map[string]bool, prefix string) bool {
	for n := range names {
		if strings.HasPrefix(n, prefix) {
			return true
		}
	}
	return false
}
