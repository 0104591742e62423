package galera

import (
	"testing"

	_ "github.com/go-sql-driver/mysql"
)

func TestGalera(t *testing.T) {
	c := startCluster(t)
	db := c.open(t, 2)
	var v string
	if err := db.QueryRow("SELECT @@wsrep_node_name").Scan(&v); err != nil {
		t.Fatal(err)
	}
	t.Log(v)
}
