package main

// concurrentFiles is the benchmark's second Go variant: the same kubeconfig
// directory as the file provider, but every new cluster is engaged in its own
// goroutine, so one cluster's cache sync (client-go polls it every 100 ms)
// does not wait for another's. multicluster-runtime's file provider engages
// them one after another; the benchmarks report both, so that the comparison
// measures runtimes rather than that provider's design choice.

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"github.com/fsnotify/fsnotify"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/cluster"

	"sigs.k8s.io/multicluster-runtime/pkg/clusters"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
)

type concurrentFiles struct {
	clusters.Clusters[cluster.Cluster]
	dir     string
	options []cluster.Option
	mu      sync.Mutex
	adding  map[multicluster.ClusterName]bool
}

func newConcurrentFiles(dir string, options []cluster.Option) *concurrentFiles {
	return &concurrentFiles{
		Clusters: clusters.New[cluster.Cluster](),
		dir:      dir,
		options:  options,
		adding:   map[multicluster.ClusterName]bool{},
	}
}

// Start scans once, then rescans on every change in the directory.
func (p *concurrentFiles) Start(ctx context.Context, aware multicluster.Aware) error {
	watcher, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer watcher.Close()
	if err := watcher.Add(p.dir); err != nil {
		return err
	}
	p.scan(ctx, aware)
	for {
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-watcher.Events:
			if !ok {
				return nil
			}
			p.scan(ctx, aware)
		case <-watcher.Errors:
		}
	}
}

func (p *concurrentFiles) scan(ctx context.Context, aware multicluster.Aware) {
	found := map[multicluster.ClusterName]clientcmd.ClientConfig{}
	paths, _ := filepath.Glob(filepath.Join(p.dir, "*.kubeconfig"))
	sort.Strings(paths)
	for _, path := range paths {
		if _, err := os.Stat(path); err != nil {
			continue
		}
		config, err := clientcmd.LoadFromFile(path)
		if err != nil {
			continue
		}
		for name := range config.Contexts {
			found[multicluster.ClusterName(path+"+"+name)] = clientcmd.NewNonInteractiveClientConfig(
				*config, name, &clientcmd.ConfigOverrides{}, nil)
		}
	}
	known := map[multicluster.ClusterName]bool{}
	for _, name := range p.ClusterNames() {
		known[name] = true
		if _, ok := found[name]; !ok {
			p.Remove(name)
		}
	}
	for name, clientConfig := range found {
		p.mu.Lock()
		busy := known[name] || p.adding[name]
		if !busy {
			p.adding[name] = true
		}
		p.mu.Unlock()
		if busy {
			continue
		}
		go func(name multicluster.ClusterName, clientConfig clientcmd.ClientConfig) {
			defer func() { p.mu.Lock(); delete(p.adding, name); p.mu.Unlock() }()
			restConfig, err := clientConfig.ClientConfig()
			if err != nil {
				return
			}
			cl, err := cluster.New(unlimited(restConfig), p.options...)
			if err != nil {
				return
			}
			_ = p.Add(ctx, name, cl, aware)
		}(name, clientConfig)
	}
}
