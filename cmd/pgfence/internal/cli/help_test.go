package cli

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
)

// helpTexts is every text of the command tree a user reads with --help:
// each command's Short, Long and Example and each flag's usage, by where
// it is.
func helpTexts() map[string]string {
	texts := map[string]string{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		name := c.CommandPath()
		texts[name+" (Short)"], texts[name+" (Long)"], texts[name+" (Example)"] = c.Short, c.Long, c.Example
		for _, fs := range []*pflag.FlagSet{c.LocalFlags(), c.PersistentFlags()} {
			fs.VisitAll(func(f *pflag.Flag) { texts[name+" --"+f.Name] = f.Usage })
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRoot(&globals{stdout: io.Discard, stderr: io.Discard}))
	return texts
}

// gofenceNames reads the exported names of package gofence from its source:
// top-level names, and the methods and fields of each type ("Lease.Tx").
func gofenceNames(t *testing.T) (top map[string]bool, members map[string]bool) {
	t.Helper()
	top, members = map[string]bool{}, map[string]bool{}
	files, err := filepath.Glob("../../../../gofence/*.go")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		require.NoError(t, err)
		for _, decl := range file.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil {
					top[d.Name.Name] = true
					continue
				}
				recv := d.Recv.List[0].Type
				if star, ok := recv.(*ast.StarExpr); ok {
					recv = star.X
				}
				if id, ok := recv.(*ast.Ident); ok {
					members[id.Name+"."+d.Name.Name] = true
					top[d.Name.Name] = true // a method named alone: "Acquire"
				}
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					switch s := spec.(type) {
					case *ast.TypeSpec:
						top[s.Name.Name] = true
						if st, ok := s.Type.(*ast.StructType); ok {
							for _, field := range st.Fields.List {
								for _, n := range field.Names {
									members[s.Name.Name+"."+n.Name] = true
									top[n.Name] = true
								}
							}
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							top[n.Name] = true
						}
					}
				}
			}
		}
	}
	for name := range top {
		if !ast.IsExported(name) {
			delete(top, name)
		}
	}
	return top, members
}

// notAPI are words of the help text that look like Go names and are not
// gofence's: proper nouns.
var notAPI = map[string]bool{"PostgreSQL": true, "PgBouncer": true, "Linux": true, "Ctrl": true}

// TestHelpNamesOnlyExistingAPI: every name of package gofence that the help
// text mentions exists ("waiters in gofence Lock" outlived the rename of Lock
// to AcquireWait, which became LeaseOptions.Wait). Checked: Type.Member
// ("Lease.Tx"); a word after "gofence" ("gofence Acquire"); a word with an inner capital
// ("PollInterval"); a capitalized word inside a sentence ("clients waiting in
// Lock"). Words in capitals (SIGTERM, TTL, JSON) and the proper nouns of
// notAPI are not names.
func TestHelpNamesOnlyExistingAPI(t *testing.T) {
	t.Parallel()
	top, members := gofenceNames(t)
	require.True(t, top["Acquire"] && members["Lease.Tx"] && members["LeaseOptions.Wait"] && top["PollInterval"], "the reading of gofence's names works")

	dotted := regexp.MustCompile(`\b([A-Z][A-Za-z0-9]*)\.([A-Z][A-Za-z0-9]*)\b`)
	afterGofence := regexp.MustCompile(`\bgofence(?:'s)?[ .]([A-Z][A-Za-z0-9]*)`)
	camel := regexp.MustCompile(`\b[A-Z][a-z0-9]+[A-Z][A-Za-z0-9]*\b`)
	// A capitalized word (not all capitals) after a lowercase word or a
	// comma, on the same line or the next (a blank line starts a
	// paragraph): inside a sentence, where English capitalizes only names.
	inSentence := regexp.MustCompile(`[a-z,](?:[ \t]+|[ \t]*\n[ \t]*)([A-Z][a-z][A-Za-z0-9]*)\b`)
	for where, text := range helpTexts() {
		var problems []string
		for _, m := range dotted.FindAllStringSubmatch(text, -1) {
			if !members[m[1]+"."+m[2]] {
				problems = append(problems, m[0])
			}
		}
		words := map[string]bool{}
		for _, m := range afterGofence.FindAllStringSubmatch(text, -1) {
			words[m[1]] = true
		}
		for _, w := range camel.FindAllString(dotted.ReplaceAllString(text, ""), -1) {
			words[w] = true
		}
		for _, m := range inSentence.FindAllStringSubmatch(dotted.ReplaceAllString(text, ""), -1) {
			words[m[1]] = true
		}
		for w := range words {
			if !top[w] && !notAPI[w] {
				problems = append(problems, w)
			}
		}
		require.Empty(t, problems, "%s names what package gofence does not have (or add a proper noun to notAPI):\n%s", where, text)
	}
}

// TestJSONFlagNamesEveryErrorKey: the --json help lists every key that an
// error document carries (it listed "error" and "exit_code" while
// "sqlstate" was emitted too).
func TestJSONFlagNamesEveryErrorKey(t *testing.T) {
	t.Parallel()
	usage := helpTexts()["pgfence --json"]
	require.NotEmpty(t, usage)
	for _, key := range jsonKeys(jsonError{}) {
		require.Contains(t, usage, strconv.Quote(key), "--json help: %q", usage)
	}
}

// TestDoctorHelpNamesEveryCheck: doctor --help and the doctor table of
// docs/cli.md name every check that doctor can report (the help listed
// fewer than it ran). The checks are read from the calls add("name", ...)
// of the doctor source files.
func TestDoctorHelpNamesEveryCheck(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("doctor*.go")
	require.NoError(t, err)
	checks := map[string]bool{}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		require.NoError(t, err)
		ast.Inspect(file, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) == 0 {
				return true
			}
			if id, ok := call.Fun.(*ast.Ident); ok && id.Name == "add" {
				if lit, ok := call.Args[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					name, err := strconv.Unquote(lit.Value)
					require.NoError(t, err)
					checks[name] = true
				}
			}
			return true
		})
	}
	require.True(t, checks["connection"] && checks["pooler"], "the reading of the checks works: %v", checks)

	long := strings.Join(strings.Fields(helpTexts()["pgfence doctor (Long)"]), " ")
	doc, err := os.ReadFile("../../../../docs/cli.md")
	require.NoError(t, err)
	for name := range checks {
		require.Contains(t, long, name, "doctor --help does not name the check %q", name)
		require.Regexp(t, `(?m)^\| `+regexp.QuoteMeta(name)+` \|`, string(doc), "docs/cli.md's doctor table has no row for %q", name)
	}
}

// jsonKeys lists the JSON keys of the fields of the struct v.
func jsonKeys(v any) []string {
	var keys []string
	rt := reflect.TypeOf(v)
	for i := range rt.NumField() {
		tag := rt.Field(i).Tag.Get("json")
		if name, _, _ := strings.Cut(tag, ","); name != "" && name != "-" {
			keys = append(keys, name)
		}
	}
	return keys
}
