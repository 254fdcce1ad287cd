package loadtest

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	ServerSideMain() // split runs start this test binary as their server side
	goleak.VerifyTestMain(m)
}
