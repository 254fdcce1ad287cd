package loadtest

import (
	"testing"

	"github.com/xdsrelay/xdsrelay/internal/lockorder/lockcheck"
)

func TestMain(m *testing.M) {
	ServerSideMain() // split runs start this test binary as their server side
	lockcheck.Main(m)
}
