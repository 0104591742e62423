// Package layout holds tests of the module's structure: which package may
// import which, and what a program using one dialect links. It has no
// code of its own.
package layout
