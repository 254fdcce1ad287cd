package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"

	"google.golang.org/grpc/grpclog"
)

// gRPC's own log lines (a GOAWAY with too_many_pings, a transport that
// closed) are written through the relay's logger, in its format and at its
// level, with component=grpc, rather than as bare "ERROR: [transport] ..."
// lines beside it. gRPC takes its logger once, before it runs
// (grpclog.SetLoggerV2), so the adapter is installed at init and the
// logger it writes to is swapped: the relay's while it runs, else the
// commands' stderr at error level, as gRPC's default logger prints.

// grpcLogs is the logger gRPC's lines go to.
var grpcLogs atomic.Pointer[slog.Logger]

func init() {
	grpcLogs.Store(defaultGRPCLogger())
	grpclog.SetLoggerV2(grpcLogger{})
}

func defaultGRPCLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})).With("component", "grpc")
}

// useGRPCLogger sends gRPC's lines to logger until restore is called.
func useGRPCLogger(logger *slog.Logger) (restore func()) {
	prev := grpcLogs.Swap(logger.With("component", "grpc"))
	return func() { grpcLogs.Store(prev) }
}

// grpcLogger is grpclog.LoggerV2 over grpcLogs. gRPC's info and warning
// lines, which its default logger does not print, are debug lines.
type grpcLogger struct{}

var _ grpclog.LoggerV2 = grpcLogger{}

func (grpcLogger) log(level slog.Level, msg string) {
	grpcLogs.Load().Log(context.Background(), level, strings.TrimSuffix(msg, "\n"))
}

func (l grpcLogger) Info(args ...any)   { l.log(slog.LevelDebug, fmt.Sprint(args...)) }
func (l grpcLogger) Infoln(args ...any) { l.log(slog.LevelDebug, fmt.Sprintln(args...)) }
func (l grpcLogger) Infof(format string, args ...any) {
	l.log(slog.LevelDebug, fmt.Sprintf(format, args...))
}
func (l grpcLogger) Warning(args ...any)   { l.log(slog.LevelDebug, fmt.Sprint(args...)) }
func (l grpcLogger) Warningln(args ...any) { l.log(slog.LevelDebug, fmt.Sprintln(args...)) }
func (l grpcLogger) Warningf(format string, args ...any) {
	l.log(slog.LevelDebug, fmt.Sprintf(format, args...))
}
func (l grpcLogger) Error(args ...any)   { l.log(slog.LevelError, fmt.Sprint(args...)) }
func (l grpcLogger) Errorln(args ...any) { l.log(slog.LevelError, fmt.Sprintln(args...)) }
func (l grpcLogger) Errorf(format string, args ...any) {
	l.log(slog.LevelError, fmt.Sprintf(format, args...))
}

// Fatal logs at error and exits, as grpclog.LoggerV2 requires.
func (l grpcLogger) Fatal(args ...any) { l.log(slog.LevelError, fmt.Sprint(args...)); os.Exit(1) }
func (l grpcLogger) Fatalln(args ...any) {
	l.log(slog.LevelError, fmt.Sprintln(args...))
	os.Exit(1)
}
func (l grpcLogger) Fatalf(format string, args ...any) {
	l.log(slog.LevelError, fmt.Sprintf(format, args...))
	os.Exit(1)
}

// V reports whether verbose level v is logged: gRPC's verbose lines are
// debug lines, logged only at level 0 (GRPC_GO_LOG_VERBOSITY_LEVEL's
// default).
func (grpcLogger) V(v int) bool {
	return v <= 0 && grpcLogs.Load().Enabled(context.Background(), slog.LevelDebug)
}
