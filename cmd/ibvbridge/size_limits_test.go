package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The command is wiring: its options, their validation and the calls into the packages that do the work.
// These limits keep it that way (a long function here is logic that belongs in a package or a helper).
const (
	maxCmdFuncLines = 80
	maxCmdFileLines = 300
)

// TestCmdFilesAndFunctionsStaySmall parses every non-test Go file under cmd/ and fails on a file over
// maxCmdFileLines lines or a function (or method, or function literal) over maxCmdFuncLines lines.
func TestCmdFilesAndFunctionsStaySmall(t *testing.T) {
	files, err := filepath.Glob("../*/*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no Go files under cmd/ (%v)", err)
	}
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		for _, v := range sizeViolations(t, path) {
			t.Error(v)
		}
	}
}

// sizeViolations returns one line per limit the file at path breaks.
func sizeViolations(t *testing.T, path string) []string {
	t.Helper()
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, src, 0)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var out []string
	if n := fset.File(f.Pos()).LineCount(); n > maxCmdFileLines {
		out = append(out, path+": "+itoa(n)+" lines, limit "+itoa(maxCmdFileLines))
	}
	ast.Inspect(f, func(n ast.Node) bool {
		var name string
		switch fn := n.(type) {
		case *ast.FuncDecl:
			name = fn.Name.Name
		case *ast.FuncLit:
			name = "func literal"
		default:
			return true
		}
		start, end := fset.Position(n.Pos()), fset.Position(n.End())
		if lines := end.Line - start.Line + 1; lines > maxCmdFuncLines {
			out = append(out, start.String()+": "+name+" is "+itoa(lines)+" lines, limit "+itoa(maxCmdFuncLines))
		}
		return true
	})
	return out
}

// TestSizeViolationsFindsLongFunctionsAndFiles proves the checker above can fail: a generated file of
// 301 lines with an 81-line function breaks both limits, one 80 lines long breaks neither.
func TestSizeViolationsFindsLongFunctionsAndFiles(t *testing.T) {
	gen := func(funcLines, fileLines int) string {
		var b strings.Builder
		b.WriteString("package p\n\nfunc f() {\n") // lines 1-3
		for i := 0; i < funcLines-2; i++ {
			b.WriteString("\t_ = 0\n")
		}
		b.WriteString("}\n")
		for n := funcLines + 2; n < fileLines; n++ {
			b.WriteString("\n")
		}
		return b.String()
	}
	dir := t.TempDir()
	for _, c := range []struct {
		funcLines, fileLines, want int
	}{{80, 300, 0}, {81, 300, 1}, {80, 301, 1}, {81, 301, 2}} {
		path := filepath.Join(dir, "x.go")
		if err := os.WriteFile(path, []byte(gen(c.funcLines, c.fileLines)), 0o600); err != nil {
			t.Fatal(err)
		}
		if got := sizeViolations(t, path); len(got) != c.want {
			t.Errorf("function of %d lines in a file of %d: %d violations %q, want %d", c.funcLines, c.fileLines, len(got), got, c.want)
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
