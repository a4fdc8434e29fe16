package assemble_test

import (
	"os"
	"testing"

	"github.com/ibvbridge/ibvbridge/internal/testenv"
)

// TestMain runs the tests in a ring directory of their own: nothing lands in /run/ibvbridge.
func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
