// Package interop holds the cross-language tests: a Go producer with Go, C and Python consumers in
// separate processes, each checking every byte of every heap and every counter. It has no non-test code.
package interop
