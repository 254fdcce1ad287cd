package main

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/grpc/grpclog"
)

// With log.format json every line is a JSON object, and the binary's log
// level is the one /debug/loglevel sets.
func TestJSONLogsAndRuntimeLevel(t *testing.T) {
	logs := &syncBuffer{}
	stop := startExampleRelay(t, map[string]string{"XDSRELAY_LOG_FORMAT": "json"}, logs)
	admin := waitForLog(t, logs, regexp.MustCompile(`"msg":"relay serving".*"admin":"([^"]+)"`))[1]
	req, _ := http.NewRequest(http.MethodPut, "http://"+admin+"/debug/loglevel", strings.NewReader("debug"))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT /debug/loglevel: %d", resp.StatusCode)
	}
	waitForLog(t, logs, regexp.MustCompile(`"level":"WARN","msg":"log level changed","from":"info","to":"debug"`))
	if c := stop(); c != 0 {
		t.Fatalf("exit %d; log:\n%s", c, logs)
	}
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if !json.Valid([]byte(line)) {
			t.Errorf("not JSON: %q", line)
		}
	}
}

func TestLogFormatIsChecked(t *testing.T) {
	for _, tc := range []struct {
		format, wantErr string
	}{
		{format: "text"},
		{format: "json"},
		{format: "logfmt", wantErr: `log.format: "logfmt" is not text or json`},
	} {
		o, _, err := loadConfig("", environ(map[string]string{"XDSRELAY_LOG_FORMAT": tc.format}))
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%s: %v", tc.format, err)
		case tc.wantErr == "" && o.LogFormat != tc.format:
			t.Errorf("%s: LogFormat %q", tc.format, o.LogFormat)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%s: error %v, want %q", tc.format, err, tc.wantErr)
		}
	}
}

// upstream.tls.insecure_skip_verify, which SECURITY.md leaves out of scope
// as a configuration the relay warns about, is warned about at startup.
func TestInsecureSkipVerifyIsWarned(t *testing.T) {
	logs := &syncBuffer{}
	stop := startRun(t, nil, map[string]string{
		"XDSRELAY_UPSTREAM_ADDRESS":                  deadAddr(t),
		"XDSRELAY_UPSTREAM_TLS_INSECURE_SKIP_VERIFY": "true",
		"XDSRELAY_DOWNSTREAM_ADDRESS":                "127.0.0.1:0",
		"XDSRELAY_ADMIN_ADDRESS":                     "127.0.0.1:0",
	}, io.Discard, logs)
	waitForLog(t, logs, regexp.MustCompile(`level=WARN msg="upstream.tls.insecure_skip_verify is set: the control plane's certificate is NOT verified"`))
	if c := stop(); c != 0 {
		t.Fatalf("exit %d; log:\n%s", c, logs)
	}
}

// gRPC's own lines (here the one its transport writes for a GOAWAY with
// too_many_pings) are written by the relay's logger, in its format and
// with component=grpc, not as a bare "ERROR: [transport] ..." line.
func TestGRPCLogsInTheRelayFormat(t *testing.T) {
	logs := &syncBuffer{}
	stop := startExampleRelay(t, map[string]string{"XDSRELAY_LOG_FORMAT": "json"}, logs)
	waitForLog(t, logs, regexp.MustCompile(`"msg":"relay serving"`))
	grpclog.Component("transport").Errorf(`Client received GoAway with error code ENHANCE_YOUR_CALM and debug data equal to ASCII "too_many_pings".`)
	waitForLog(t, logs, regexp.MustCompile(`\{"time":"[^"]+","level":"ERROR","msg":"\[transport\] Client received GoAway with error code ENHANCE_YOUR_CALM and debug data equal to ASCII \\"too_many_pings\\".","component":"grpc"\}`))
	if c := stop(); c != 0 {
		t.Fatalf("exit %d; log:\n%s", c, logs)
	}
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if !json.Valid([]byte(line)) {
			t.Errorf("not JSON: %q", line)
		}
	}
}

// gRPC's info and warning lines are the relay's debug lines, its errors
// error lines, its verbose lines debug at level 0 only; and restore gives
// gRPC's lines back to the logger they went to before.
func TestGRPCLoggerLevels(t *testing.T) {
	before := grpcLogs.Load()
	info, debug := &syncBuffer{}, &syncBuffer{}
	restore := useGRPCLogger(slog.New(slog.NewTextHandler(info, &slog.HandlerOptions{Level: slog.LevelInfo})))
	l := grpcLogger{}
	l.Infof("info %d", 1)
	l.Warningln("warning", 2)
	l.Errorln("error", 3)
	if l.V(0) {
		t.Error("V(0) at level info: true, want false")
	}
	if got := info.String(); strings.Contains(got, "info 1") || strings.Contains(got, "warning 2") ||
		!strings.Contains(got, `level=ERROR msg="error 3" component=grpc`) {
		t.Errorf("at level info: %q; want only the error, without its newline", got)
	}
	restore()
	if grpcLogs.Load() != before {
		t.Fatal("restore did not put back the logger before")
	}

	defer useGRPCLogger(slog.New(slog.NewTextHandler(debug, &slog.HandlerOptions{Level: slog.LevelDebug})))()
	l.Info("info ", 4)
	l.Warningf("warning %d", 5)
	if !l.V(0) || l.V(2) {
		t.Errorf("at level debug: V(0) %v, V(2) %v; want true, false", l.V(0), l.V(2))
	}
	for _, want := range []string{`level=DEBUG msg="info 4" component=grpc`, `level=DEBUG msg="warning 5" component=grpc`} {
		if !strings.Contains(debug.String(), want) {
			t.Errorf("at level debug: %q lacks %q", debug.String(), want)
		}
	}
}
