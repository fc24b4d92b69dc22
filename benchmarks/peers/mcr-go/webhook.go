package main

// -webhook mode (S13): controller-runtime's webhook server with one validating
// admission webhook for ConfigMaps, the same rule as the mcruntime peer's
// validator (peers/webhook_peer.py): the label bench.mcruntime.dev/tier must be
// gold, silver or bronze. The harness writes the serving certificate and key
// into -cert-dir and installs the ValidatingWebhookConfiguration that points
// the API server at https://127.0.0.1:<port>/validate-configmap; this process
// only serves. It reports {"ev":"start"} like every peer, and exits on EOF on
// stdin or SIGTERM.

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

const (
	tierLabel   = "bench.mcruntime.dev/tier"
	webhookPath = "/validate-configmap"
)

var tiers = map[string]bool{"gold": true, "silver": true, "bronze": true}

// tierValidator admits a ConfigMap whose tier label names a known tier.
type tierValidator struct {
	decoder admission.Decoder
}

func (v *tierValidator) Handle(_ context.Context, req admission.Request) admission.Response {
	cm := &corev1.ConfigMap{}
	if err := v.decoder.Decode(req, cm); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	tier := cm.Labels[tierLabel]
	if !tiers[tier] {
		return admission.Denied(fmt.Sprintf("label %s must be gold, silver or bronze, not %q", tierLabel, tier))
	}
	return admission.Allowed("")
}

func serveWebhook(o *out, port int, certDir string) error {
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return err
	}
	server := webhook.NewServer(webhook.Options{Host: "127.0.0.1", Port: port, CertDir: certDir})
	server.Register(webhookPath, &webhook.Admission{Handler: &tierValidator{decoder: admission.NewDecoder(scheme)}})
	go func() { // EOF on stdin (the harness went away) stops the peer
		scanner := bufio.NewScanner(os.Stdin)
		for scanner.Scan() {
		}
		cancel()
	}()
	o.flush()
	if err := server.Start(ctx); err != nil && ctx.Err() == nil {
		return err
	}
	return nil
}
