package main

import (
	"go/ast"
	"strconv"
	"strings"
)

// comment splits a doc comment into its prose and its markers (lines starting with +, as controller-gen
// reads them). Prose paragraphs are joined into one line each, paragraphs separated by a blank line.
func comment(g *ast.CommentGroup) (text string, markers []string) {
	if g == nil {
		return "", nil
	}
	var paras []string
	var cur []string
	flush := func() {
		if len(cur) > 0 {
			paras = append(paras, strings.Join(cur, " "))
			cur = nil
		}
	}
	for _, c := range g.List {
		line := strings.TrimPrefix(c.Text, "//")
		line = strings.TrimPrefix(line, " ")
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trimmed, "+"):
			flush()
			markers = append(markers, trimmed)
		case trimmed == "":
			flush()
		default:
			cur = append(cur, trimmed)
		}
	}
	flush()
	return strings.Join(paras, "\n\n"), markers
}

// oneLine is text as one line, paragraphs joined by a space, for a table cell.
func oneLine(text string) string { return strings.Join(strings.Fields(text), " ") }

// cell escapes text for a Markdown table cell: pipes would end the cell and angle brackets would read as
// HTML (<host-root>, <N>g.<M>gb).
func cell(text string) string {
	r := strings.NewReplacer("|", `\|`, "<", "&lt;", ">", "&gt;")
	return r.Replace(oneLine(text))
}

// code is text as a Markdown code span that survives a table cell: pipes escaped, backticks fenced by
// a longer run.
func code(text string) string {
	text = strings.ReplaceAll(text, "|", `\|`)
	fence := "`"
	for strings.Contains(text, fence) {
		fence += "`"
	}
	if strings.HasPrefix(text, "`") || strings.HasSuffix(text, "`") {
		return fence + " " + text + " " + fence
	}
	return fence + text + fence
}

// marker is one +kubebuilder marker: its name (validation:Minimum, default, ...) and its argument as
// written after "=" (empty for flags such as +optional).
type marker struct{ name, arg string }

// parseMarker reads "+kubebuilder:validation:Maximum=1000", "+optional" or "+listType=map".
func parseMarker(m string) marker {
	m = strings.TrimPrefix(m, "+")
	m = strings.TrimPrefix(m, "kubebuilder:")
	name, arg, _ := strings.Cut(m, "=")
	// Markers with named arguments (+kubebuilder:validation:XValidation:rule="...",message="...") keep
	// them all in arg.
	for _, p := range []string{"validation:XValidation", "validation:items:XValidation", "printcolumn", "resource"} {
		if rest, ok := strings.CutPrefix(name, p+":"); ok {
			return marker{name: p, arg: rest + "=" + arg}
		}
	}
	return marker{name: name, arg: arg}
}

// markerArgs reads the key="value",key=value arguments of a marker such as XValidation; quoted values
// are unquoted as Go strings.
func markerArgs(s string) map[string]string {
	args := map[string]string{}
	for s != "" {
		key, rest, ok := strings.Cut(s, "=")
		if !ok {
			break
		}
		var val string
		if strings.HasPrefix(rest, `"`) || strings.HasPrefix(rest, "`") {
			q, err := strconv.QuotedPrefix(rest)
			if err != nil {
				break
			}
			val, _ = strconv.Unquote(q)
			rest = rest[len(q):]
		} else {
			val, rest, _ = strings.Cut(rest, ",")
			rest = "," + rest
		}
		args[strings.TrimSpace(key)] = val
		s = strings.TrimPrefix(rest, ",")
	}
	return args
}
