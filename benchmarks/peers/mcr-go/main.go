// Command mcr-go is the Go peer of mcruntime's benchmarks: a multicluster-runtime
// manager with the file provider and one ConfigMap controller, doing the same
// reconcile work as benchmarks/peers/mcruntime_peer.py and reporting the same
// JSON lines, so the harness can compare the two on the same control planes.
//
// Protocol (shared by every peer):
//
//	stdout: {"ev":"start","t":<unix seconds>}                 once, when main begins
//	        {"ev":"r","c":cluster,"n":name,"t":start,"w":ts}    one per reconcile
//	        {"ev":"stats","clusters":n,"tasks":goroutines}      in answer to "stats"
//	        {"ev":"gc","heap":bytes}                            in answer to "gc" (HeapInuse)
//	stdin:  "stats"  report the counters above
//	        "gc"     collect garbage and return memory to the OS, then answer "gc"
//
// Fairness settings shared with the mcruntime peer: the cache strips
// managedFields (mcruntime's default transform), client-side rate limiting is
// off (QPS -1; mcruntime has no limiter), and -engage concurrent engages
// clusters side by side (see concurrent.go) instead of the file provider's one
// at a time. -mode write patches each object once (data.observed), -mode live
// reads from the API server instead of the cache. -wire json makes the client and
// the cache speak JSON: controller-runtime picks protobuf for built-in kinds such
// as ConfigMap, and JSON for every custom resource (CRDs have no protobuf), so
// this is how the same runtime talks to an operator's own kinds.
// -floor lists and exits.
// -webhook-port serves S13's validating admission webhook (webhook.go) instead.
//
// Timestamps are wall-clock seconds (time.Now), the clock the harness's writer
// uses, so write-to-reconcile latency needs no clock translation.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	mcbuilder "sigs.k8s.io/multicluster-runtime/pkg/builder"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"
	"sigs.k8s.io/multicluster-runtime/providers/file"
)

// out serialises JSON lines; a ticker flushes it so the harness sees progress
// without a write system call per reconcile.
type out struct {
	mu sync.Mutex
	w  *bufio.Writer
}

func (o *out) emit(v any, flush bool) {
	line, _ := json.Marshal(v)
	o.mu.Lock()
	defer o.mu.Unlock()
	o.w.Write(line)
	o.w.WriteByte('\n')
	if flush {
		o.w.Flush()
	}
}

func (o *out) flush() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.w.Flush()
}

func now() float64 { return float64(time.Now().UnixNano()) / 1e9 }

func main() {
	started := now()
	dir := flag.String("kubeconfig-dir", "", "directory of *.kubeconfig files, one cluster per context")
	local := flag.String("local-kubeconfig", "", "kubeconfig of the manager's local cluster (multicluster-runtime needs one)")
	namespace := flag.String("namespace", "", "the only namespace whose ConfigMaps are cached and reconciled")
	workers := flag.Int("workers", 1, "MaxConcurrentReconciles (controller-runtime's default is 1)")
	engage := flag.String("engage", "shipped", "shipped: the file provider (one cluster at a time); concurrent: all at once")
	mode := flag.String("mode", "read", "read: from the cache; write: patch data.observed once; live: GET from the API server")
	runID := flag.String("run-id", "0", "write mode: marks this run's patches")
	floorRuns := flag.Int("floor", 0, "list every context's namespace this many times (after one warm-up), report the fastest, exit")
	webhookPort := flag.Int("webhook-port", 0, "serve the S13 validating webhook on this port (see webhook.go) instead of reconciling")
	certDir := flag.String("cert-dir", "", "webhook mode: directory with tls.crt and tls.key")
	wire := flag.String("wire", "default", "default: controller-runtime's choice (protobuf for built-in kinds); json: JSON, as for a custom resource")
	flag.Parse()
	switch *wire {
	case "default":
	case "json":
		jsonWire = true
	default:
		fmt.Fprintf(os.Stderr, "mcr-go: -wire: unknown value %q (default or json)\n", *wire)
		os.Exit(2)
	}
	ctrllog.SetLogger(logr.Discard())

	o := &out{w: bufio.NewWriterSize(os.Stdout, 1<<16)}
	o.emit(map[string]any{"ev": "start", "t": started}, true)
	var err error
	if *floorRuns > 0 {
		err = floor(o, *dir, *namespace, *floorRuns)
	} else if *webhookPort > 0 {
		err = serveWebhook(o, *webhookPort, *certDir)
	} else {
		err = run(o, *dir, *local, *namespace, *workers, *engage, *mode, *runID)
	}
	if err != nil {
		o.flush()
		fmt.Fprintln(os.Stderr, "mcr-go:", err)
		os.Exit(1)
	}
	o.flush()
}

// jsonWire is -wire json: every request and watch in JSON, as for a custom resource.
var jsonWire bool

// unlimited turns client-go's client-side rate limit off (QPS < 0): mcruntime has none.
// With -wire json it also sets the content type, which controller-runtime then
// keeps instead of choosing protobuf for built-in kinds.
func unlimited(config *rest.Config) *rest.Config {
	config = rest.CopyConfig(config)
	config.QPS = -1
	if jsonWire {
		config.ContentType = "application/json"
		config.AcceptContentTypes = "application/json"
	}
	return config
}

// clusterOptions are the same for both engage modes: one namespace, managedFields
// stripped, and no client-side rate limit for the client or the cache.
func clusterOptions(namespace string) []cluster.Option {
	return []cluster.Option{func(opts *cluster.Options) {
		if namespace != "" {
			opts.Cache.DefaultNamespaces = map[string]cache.Config{namespace: {}}
		}
		opts.Cache.DefaultTransform = cache.TransformStripManagedFields()
		opts.NewCache = func(config *rest.Config, options cache.Options) (cache.Cache, error) {
			return cache.New(unlimited(config), options)
		}
		opts.NewClient = func(config *rest.Config, options client.Options) (client.Client, error) {
			return client.New(unlimited(config), options)
		}
	}}
}

type namedProvider interface {
	multicluster.ProviderRunnable
	multicluster.Provider
	ClusterNames() []multicluster.ClusterName
}

func run(o *out, dir, local, namespace string, workers int, engage, mode, runID string) error {
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()

	var provider namedProvider
	switch engage {
	case "shipped":
		shipped, err := file.New(file.Options{KubeconfigDirs: []string{dir}, ClusterOptions: clusterOptions(namespace)})
		if err != nil {
			return fmt.Errorf("file provider: %w", err)
		}
		provider = shipped
	case "concurrent":
		provider = newConcurrentFiles(dir, clusterOptions(namespace))
	default:
		return fmt.Errorf("unknown -engage %q", engage)
	}
	localConfig, err := clientcmd.BuildConfigFromFlags("", local)
	if err != nil {
		return fmt.Errorf("local kubeconfig: %w", err)
	}
	localConfig = unlimited(localConfig)
	mgr, err := mcmanager.New(localConfig, provider, mcmanager.Options{
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		return fmt.Errorf("manager: %w", err)
	}

	reconcile := func(ctx context.Context, req mcreconcile.Request) (ctrl.Result, error) {
		begun := now()
		cl, err := mgr.GetCluster(ctx, req.ClusterName)
		if err != nil {
			return ctrl.Result{}, err
		}
		cm := &corev1.ConfigMap{}
		var reader client.Reader = cl.GetClient()
		if mode == "live" {
			reader = cl.GetAPIReader()
		}
		if err := reader.Get(ctx, req.NamespacedName, cm); err != nil {
			if apierrors.IsNotFound(err) {
				return ctrl.Result{}, nil
			}
			return ctrl.Result{}, err
		}
		record := map[string]any{"ev": "r", "c": string(req.ClusterName), "n": req.Name, "t": begun}
		if written, err := strconv.ParseFloat(cm.Data["ts"], 64); err == nil {
			record["w"] = written
		}
		if mode == "write" {
			marker := runID + ":" + cm.Data["ts"]
			if cm.Data["observed"] == marker {
				return ctrl.Result{}, nil // our own write coming back: nothing to do, no record
			}
			patch, _ := json.Marshal(map[string]any{"data": map[string]string{"observed": marker}})
			if err := cl.GetClient().Patch(ctx, cm, client.RawPatch(types.MergePatchType, patch)); err != nil {
				return ctrl.Result{}, err
			}
			record["p"] = 1
		}
		o.emit(record, false)
		return ctrl.Result{}, nil
	}
	if err := mcbuilder.ControllerManagedBy(mgr).
		Named("bench").
		For(&corev1.ConfigMap{}).
		WithOptions(controller.TypedOptions[mcreconcile.Request]{MaxConcurrentReconciles: workers}).
		Complete(mcreconcile.Func(reconcile)); err != nil {
		return fmt.Errorf("controller: %w", err)
	}

	go func() { // flush reconcile records every 50 ms
		ticker := time.NewTicker(50 * time.Millisecond)
		defer ticker.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
				o.flush()
			}
		}
	}()
	go func() { // stdin commands; EOF (the harness went away) stops the peer
		scanner := bufio.NewScanner(os.Stdin)
		for scanner.Scan() {
			switch scanner.Text() {
			case "stats":
				o.emit(map[string]any{
					"ev": "stats", "clusters": len(provider.ClusterNames()), "tasks": runtime.NumGoroutine(),
				}, true)
			case "gc":
				runtime.GC()
				debug.FreeOSMemory()
				var stats runtime.MemStats
				runtime.ReadMemStats(&stats)
				o.emit(map[string]any{"ev": "gc", "heap": stats.HeapInuse}, true)
			}
		}
		cancel()
	}()

	if err := mgr.Start(ctx); err != nil && ctx.Err() == nil {
		return err
	}
	return nil
}
