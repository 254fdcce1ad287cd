package fleet

import (
	"testing"

	"github.com/xdsrelay/xdsrelay/internal/lockorder/lockcheck"
)

func TestMain(m *testing.M) { lockcheck.Main(m) }
