package lockorder

import (
	"sync"
	"unsafe"
)

// Class names a lock in the design: a zero-size type whose LockName is the
// name docs/architecture.md gives the lock, "Type.field" ("Cache.mu").
type Class interface {
	LockName() string
}

// className is the name of the class C.
func className[C Class]() string {
	var c C
	return c.LockName()
}

// Mutex is a sync.Mutex of the class C. Its zero value is unlocked.
type Mutex[C Class] struct {
	mu sync.Mutex
}

// Lock locks m, as sync.Mutex.Lock.
func (m *Mutex[C]) Lock() {
	if enabled {
		noteLock(unsafe.Pointer(m), className[C]())
	}
	m.mu.Lock()
}

// TryLock tries to lock m, as sync.Mutex.TryLock. A lock taken by TryLock
// never waits, so it orders nothing under the locks held; what is taken
// under it is ordered after it.
func (m *Mutex[C]) TryLock() bool {
	ok := m.mu.TryLock()
	if enabled && ok {
		noteTry(unsafe.Pointer(m), className[C]())
	}
	return ok
}

// Unlock unlocks m, as sync.Mutex.Unlock.
func (m *Mutex[C]) Unlock() {
	if enabled {
		noteUnlock(unsafe.Pointer(m))
	}
	m.mu.Unlock()
}

// RWMutex is a sync.RWMutex of the class C. Its zero value is unlocked. A
// read lock is ordered as a write lock is: a reader waits behind a writer
// that waits.
type RWMutex[C Class] struct {
	mu sync.RWMutex
}

// Lock locks rw for writing, as sync.RWMutex.Lock.
func (rw *RWMutex[C]) Lock() {
	if enabled {
		noteLock(unsafe.Pointer(rw), className[C]())
	}
	rw.mu.Lock()
}

// TryLock tries to lock rw for writing, as sync.RWMutex.TryLock.
func (rw *RWMutex[C]) TryLock() bool {
	ok := rw.mu.TryLock()
	if enabled && ok {
		noteTry(unsafe.Pointer(rw), className[C]())
	}
	return ok
}

// Unlock unlocks rw for writing, as sync.RWMutex.Unlock.
func (rw *RWMutex[C]) Unlock() {
	if enabled {
		noteUnlock(unsafe.Pointer(rw))
	}
	rw.mu.Unlock()
}

// RLock locks rw for reading, as sync.RWMutex.RLock.
func (rw *RWMutex[C]) RLock() {
	if enabled {
		noteLock(unsafe.Pointer(rw), className[C]())
	}
	rw.mu.RLock()
}

// TryRLock tries to lock rw for reading, as sync.RWMutex.TryRLock.
func (rw *RWMutex[C]) TryRLock() bool {
	ok := rw.mu.TryRLock()
	if enabled && ok {
		noteTry(unsafe.Pointer(rw), className[C]())
	}
	return ok
}

// RUnlock undoes one RLock, as sync.RWMutex.RUnlock.
func (rw *RWMutex[C]) RUnlock() {
	if enabled {
		noteUnlock(unsafe.Pointer(rw))
	}
	rw.mu.RUnlock()
}

// Checking says whether this build records the locks taken: in a race
// build only.
const Checking = enabled
