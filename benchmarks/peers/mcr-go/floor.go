package main

// floor is the Go floor of S1: every context's namespace listed (500 a page,
// contexts concurrently) and decoded into typed ConfigMaps with client-go, no
// runtime. One warm-up pass opens the connections; the fastest of the timed
// passes is reported.

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

func floor(o *out, dir, namespace string, runs int) error {
	paths, err := filepath.Glob(filepath.Join(dir, "*.kubeconfig"))
	if err != nil {
		return err
	}
	var clients []*kubernetes.Clientset
	for _, path := range paths {
		config, err := clientcmd.LoadFromFile(path)
		if err != nil {
			return err
		}
		for name := range config.Contexts {
			restConfig, err := clientcmd.NewNonInteractiveClientConfig(*config, name, &clientcmd.ConfigOverrides{}, nil).ClientConfig()
			if err != nil {
				return err
			}
			clientset, err := kubernetes.NewForConfig(unlimited(restConfig))
			if err != nil {
				return err
			}
			clients = append(clients, clientset)
		}
	}
	pass := func() (int, error) {
		var wg sync.WaitGroup
		var mu sync.Mutex
		total, failure := 0, error(nil)
		for _, clientset := range clients {
			wg.Add(1)
			go func(clientset *kubernetes.Clientset) {
				defer wg.Done()
				options := metav1.ListOptions{Limit: 500}
				count := 0
				for {
					page, err := clientset.CoreV1().ConfigMaps(namespace).List(context.Background(), options)
					if err != nil {
						mu.Lock()
						failure = err
						mu.Unlock()
						return
					}
					count += len(page.Items)
					if page.Continue == "" {
						break
					}
					options.Continue = page.Continue
				}
				mu.Lock()
				total += count
				mu.Unlock()
			}(clientset)
		}
		wg.Wait()
		return total, failure
	}
	if _, err := pass(); err != nil { // warm-up: connections and TLS sessions
		return fmt.Errorf("floor warm-up: %w", err)
	}
	best, count := -1.0, 0
	for range runs {
		began := time.Now()
		n, err := pass()
		if err != nil {
			return fmt.Errorf("floor: %w", err)
		}
		elapsed := time.Since(began).Seconds()
		if best < 0 || elapsed < best {
			best = elapsed
		}
		count = n
	}
	o.emit(map[string]any{"ev": "floor", "n": count, "s": best}, true)
	return nil
}
