package proc

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// CacheDir returns the per-machine cache directory of release version of name: $env/<version>
// when the environment variable env is set, else the user's cache directory
// (~/.cache/keiro-go/<name>-<version>). what names the contents in errors.
func CacheDir(env, name, version, what string) (string, error) {
	if d := os.Getenv(env); d != "" {
		return filepath.Join(d, version), nil
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("find a cache directory for %s (set %s): %w", what, env, err)
	}
	return filepath.Join(base, "keiro-go", name+"-"+version), nil
}

// LockDir creates dir if needed and takes its exclusive lock (the file "lock" in it), waiting
// while another process, or another caller in this one, holds it: a download or build into a
// cache runs once per machine however many test binaries start at once. unlock releases it.
func LockDir(dir, what string) (unlock func(), err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create the %s cache %s: %w", what, dir, err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open the %s cache lock: %w", what, err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		_ = lock.Close()
		return nil, fmt.Errorf("lock the %s cache: %w", what, err)
	}
	return func() {
		_ = syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
		_ = lock.Close()
	}, nil
}

// RunDir is the working directory of a server the kit runs (its configuration and log): the
// one the caller named, or a temporary one that Remove deletes.
type RunDir struct {
	// Path is the directory.
	Path string

	temp bool
}

// NewRunDir returns path as the run directory, or a new temporary one named after prefix when
// path is empty.
func NewRunDir(path, prefix string) (RunDir, error) {
	if path != "" {
		return RunDir{Path: path}, nil
	}
	tmp, err := os.MkdirTemp("", prefix)
	if err != nil {
		return RunDir{}, fmt.Errorf("create the run directory: %w", err)
	}
	return RunDir{Path: tmp, temp: true}, nil
}

// Remove deletes a temporary run directory, unless the environment variable keepEnv is set
// (to read a failed run's log).
func (d RunDir) Remove(keepEnv string) {
	if d.temp && os.Getenv(keepEnv) == "" {
		_ = os.RemoveAll(d.Path)
	}
}
