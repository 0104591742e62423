// Package compose checks docker-compose.yml without Docker: the services,
// ports, pinned images, health checks and Kafka's KRaft settings that the
// examples and scripts/test.sh rely on.
package compose

import (
	"bytes"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// file is the part of the Compose format the file may use. Decoding with
// KnownFields rejects anything else, so a misspelt key fails here instead of
// being ignored by docker compose.
type file struct {
	Name     string             `yaml:"name"`
	Services map[string]service `yaml:"services"`
}

type service struct {
	Image       string            `yaml:"image"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Ports       []string          `yaml:"ports"`
	Healthcheck *healthcheck      `yaml:"healthcheck"`
}

type healthcheck struct {
	Test        []string `yaml:"test"`
	Interval    string   `yaml:"interval"`
	Timeout     string   `yaml:"timeout"`
	Retries     int      `yaml:"retries"`
	StartPeriod string   `yaml:"start_period"`
}

// The servers the examples' flags and tests/testdb default to.
const (
	postgresDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	mysqlDSN    = "root@tcp(127.0.0.1:3306)/test?parseTime=true"
	kafkaBroker = "localhost:9092"
	// The transport tests' defaults (tests/nats, tests/amqp, tests/redisstream).
	natsURL   = "nats://127.0.0.1:4222"
	amqpURI   = "amqp://guest:guest@127.0.0.1:5672/"
	redisAddr = "127.0.0.1:6379"
)

func load(t *testing.T) file {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docker-compose.yml"))
	require.NoError(t, err)
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	var f file
	require.NoError(t, dec.Decode(&f))
	return f
}

func TestComposeServices(t *testing.T) {
	f := load(t)
	require.NotEmpty(t, f.Name)
	names := make([]string, 0, len(f.Services))
	for n := range f.Services {
		names = append(names, n)
	}
	slices.Sort(names)
	require.Equal(t, []string{"kafka", "mariadb", "nats", "postgres", "rabbitmq", "redis"}, names, "no ZooKeeper, nothing else")
}

// exactTag: a version with at least major.minor, never latest or a bare
// major version that moves under the user.
var exactTag = regexp.MustCompile(`^[a-z0-9][a-z0-9._/-]*:\d+\.\d+(\.\d+)?(-[a-z0-9]+)?$`)

func TestComposeImagesArePinned(t *testing.T) {
	for name, s := range load(t).Services {
		require.Regexp(t, exactTag, s.Image, "service %s", name)
		require.NotContains(t, s.Image, "latest", "service %s", name)
	}
}

func TestComposeHealthchecks(t *testing.T) {
	for name, s := range load(t).Services {
		h := s.Healthcheck
		require.NotNil(t, h, "service %s has no healthcheck, so `docker compose up --wait` cannot wait for it", name)
		require.NotEmpty(t, h.Test, name)
		require.Contains(t, []string{"CMD", "CMD-SHELL"}, h.Test[0], name)
		require.Greater(t, len(h.Test), 1, name)
		require.Positive(t, h.Retries, name)
		for _, d := range []string{h.Interval, h.Timeout} {
			v, err := time.ParseDuration(d)
			require.NoError(t, err, "service %s", name)
			require.Positive(t, v, name)
		}
	}
}

// hostPort returns the host port a "[ip:]host:container" mapping publishes
// for container port want, and the interface it binds.
func hostPort(t *testing.T, ports []string, want int) (ip string, port int) {
	t.Helper()
	for _, p := range ports {
		parts := strings.Split(p, ":")
		require.GreaterOrEqual(t, len(parts), 2, "port mapping %q names no host port", p)
		container, err := strconv.Atoi(parts[len(parts)-1])
		require.NoError(t, err, p)
		if container != want {
			continue
		}
		host, err := strconv.Atoi(parts[len(parts)-2])
		require.NoError(t, err, p)
		if len(parts) == 3 {
			ip = parts[0]
		}
		return ip, host
	}
	t.Fatalf("container port %d is not published (ports %q)", want, ports)
	return "", 0
}

// TestComposeMatchesTheDefaults: the DSNs and broker address the examples
// and tests use by default reach these services.
func TestComposeMatchesTheDefaults(t *testing.T) {
	f := load(t)

	pg, err := url.Parse(postgresDSN)
	require.NoError(t, err)
	s := f.Services["postgres"]
	ip, port := hostPort(t, s.Ports, 5432)
	require.Equal(t, "127.0.0.1", ip)
	require.Equal(t, pg.Port(), strconv.Itoa(port))
	require.Equal(t, strings.TrimPrefix(pg.Path, "/"), s.Environment["POSTGRES_DB"])
	require.Equal(t, "postgres", pg.User.Username())
	require.Equal(t, "trust", s.Environment["POSTGRES_HOST_AUTH_METHOD"], "the DSN has no password")

	my, err := mysql.ParseDSN(mysqlDSN)
	require.NoError(t, err)
	s = f.Services["mariadb"]
	ip, port = hostPort(t, s.Ports, 3306)
	require.Equal(t, "127.0.0.1", ip)
	require.Equal(t, my.Addr, "127.0.0.1:"+strconv.Itoa(port))
	require.Equal(t, my.DBName, s.Environment["MARIADB_DATABASE"])
	require.Equal(t, "root", my.User)
	require.Empty(t, my.Passwd)
	require.Equal(t, "1", s.Environment["MARIADB_ALLOW_EMPTY_ROOT_PASSWORD"])

	s = f.Services["kafka"]
	_, port = hostPort(t, s.Ports, 9092)
	require.Equal(t, kafkaBroker, "localhost:"+strconv.Itoa(port))
	// Clients connect wherever the broker advertises: the host's side of
	// the port mapping, not the container's name.
	require.Contains(t, strings.Split(s.Environment["KAFKA_ADVERTISED_LISTENERS"], ","), "PLAINTEXT://"+kafkaBroker)

	for name, addr := range map[string]string{"nats": natsURL, "rabbitmq": amqpURI, "redis": "redis://" + redisAddr} {
		u, err := url.Parse(addr)
		require.NoError(t, err)
		want, err := strconv.Atoi(u.Port())
		require.NoError(t, err)
		ip, port := hostPort(t, f.Services[name].Ports, want)
		require.Equal(t, "127.0.0.1", ip, name)
		require.Equal(t, want, port, name)
	}
	// The NATS tests use JetStream, which the server runs only with -js.
	require.Contains(t, f.Services["nats"].Command, "-js")
}

// TestComposeKafkaIsKRaft: one node that is its own controller, no
// ZooKeeper anywhere.
func TestComposeKafkaIsKRaft(t *testing.T) {
	f := load(t)
	env := f.Services["kafka"].Environment
	roles := strings.Split(env["KAFKA_PROCESS_ROLES"], ",")
	slices.Sort(roles)
	require.Equal(t, []string{"broker", "controller"}, roles)
	require.NotEmpty(t, env["KAFKA_NODE_ID"])
	require.Equal(t, env["KAFKA_NODE_ID"]+"@localhost:9093", env["KAFKA_CONTROLLER_QUORUM_VOTERS"])
	controller := env["KAFKA_CONTROLLER_LISTENER_NAMES"]
	require.NotEmpty(t, controller)
	require.Contains(t, env["KAFKA_LISTENERS"], controller+"://:9093")
	require.Contains(t, env["KAFKA_LISTENERS"], "PLAINTEXT://:9092")
	require.Contains(t, env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"], controller+":")
	require.Equal(t, "1", env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"], "a single node cannot hold more replicas")
	for name, s := range f.Services {
		require.NotContains(t, strings.ToLower(name+s.Image), "zookeeper")
		for k := range s.Environment {
			require.NotContains(t, k, "ZOOKEEPER", "service %s", name)
		}
	}
}
