package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(cleanRun{m})
}

// cleanRun runs the tests, then removes the relay they built.
type cleanRun struct{ m *testing.M }

func (c cleanRun) Run() int {
	defer func() {
		if built.dir != "" {
			os.RemoveAll(built.dir)
		}
	}()
	return c.m.Run()
}

// built is cmd/xdsrelay, built once for every test that runs it.
var built struct {
	once sync.Once
	dir  string
	bin  string
	err  error
	out  []byte
}

// relayBinary builds cmd/xdsrelay from the repository root (deploy/'s
// parent) once, and returns its path.
func relayBinary(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "xdsrelay-deploy-"); built.err != nil {
			return
		}
		built.bin = filepath.Join(built.dir, "xdsrelay")
		build := exec.Command("go", "build", "-o", built.bin, "./cmd/xdsrelay")
		build.Dir = ".."
		built.out, built.err = build.CombinedOutput()
	})
	if built.err != nil {
		t.Fatalf("go build ./cmd/xdsrelay: %v\n%s", built.err, built.out)
	}
	return built.bin
}
