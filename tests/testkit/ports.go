package testkit

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
)

// FreePorts returns n distinct ports of 127.0.0.1 that were free a moment
// ago, for the scratch servers a test starts (a Galera cluster, a
// PostgreSQL primary and standby). They are taken below the kernel's
// range of ephemeral ports where there is room: a port picked in that
// range (as listening on ":0" picks) can be taken, before the server binds
// it seconds later, as the source port of any outgoing connection on the
// machine, which a second test run beside this one opens by the
// thousand. Below the range only another explicit bind can take it.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	var ls []net.Listener
	var ports []int
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	lo, hi := 20000, ephemeralLow()-1
	for tries := 0; len(ports) < n && hi-lo >= 1000 && tries < 50*n; tries++ {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", lo+rand.IntN(hi-lo+1)))
		if err != nil {
			continue // taken
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for len(ports) < n { // no room below the range: the kernel's pick
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("find a free port: %v", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// ephemeralLow returns the lowest port the kernel gives outgoing
// connections (Linux's default, 32768, where it cannot tell).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	v, err := strconv.Atoi(f[0])
	if err != nil || v <= 1024 {
		return 32768
	}
	return v
}
