// Package galera runs the inbox on a real multi-master cluster: a
// three-node MariaDB Galera cluster started inside the test run, on
// loopback ports in a temporary directory, and stopped by PID when the
// test ends.
//
// Galera certifies a transaction when it commits: two nodes can both
// accept the same key and one of the commits then fails with error 1213.
// The tests show that the store and the middleware keep one effect per key
// through that, through a node killed mid-stream, and through migrations
// run on two nodes at once.
//
// The tests need mariadbd, mariadb-install-db, the galera-4 provider and
// rsync. Without them they skip, or fail when the CI environment variable
// is set. INBOXMILL_GALERA_EVENTS scales the number of events per test.
package galera
