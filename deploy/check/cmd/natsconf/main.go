// Command natsconf writes deploy/nats/: the NATS server configurations and
// the per-service users with least-privilege permissions, from the model in
// deploy/check/natsconf.go. Run it from the repository root:
//
//	go run ./deploy/check/cmd/natsconf -partitions 8
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/snipdev/snip/deploy/check"
	"github.com/snipdev/snip/pkg/topology"
)

func main() {
	partitions := flag.Int("partitions", topology.DefaultPartitions, "CLICKS partitions (SNIP_PARTITIONS)")
	root := flag.String("root", ".", "repository root")
	flag.Parse()
	for path, content := range check.Files(*partitions) {
		full := filepath.Join(*root, path)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			fmt.Fprintln(os.Stderr, "natsconf:", err)
			os.Exit(1)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "natsconf:", err)
			os.Exit(1)
		}
		fmt.Println("wrote", path)
	}
}
