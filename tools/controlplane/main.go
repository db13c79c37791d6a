// Command controlplane runs a whole Kubernetes control plane in one process for
// Tangram's tests and `tangram cluster up`: embedded etcd, kube-apiserver,
// kube-controller-manager and kube-scheduler, all built from the pinned
// k8s.io/kubernetes release. One binary links Kubernetes once instead of four
// times, which is what keeps a cold CI build inside its time limit.
//
// Every port is chosen by the caller so that parallel test sessions never
// collide. Keys and certificates are generated into --data-dir at start. Once
// every component answers its health endpoint the program prints one line,
// "TANGRAM-CONTROLPLANE READY <json>", that the Python launcher waits for.
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"go.etcd.io/etcd/server/v3/embed"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	cliflag "k8s.io/component-base/cli/flag"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"

	utilfeature "k8s.io/apiserver/pkg/util/feature"
	apiserverapp "k8s.io/kubernetes/cmd/kube-apiserver/app"
	apiserveroptions "k8s.io/kubernetes/cmd/kube-apiserver/app/options"
	kcmapp "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	kcmoptions "k8s.io/kubernetes/cmd/kube-controller-manager/app/options"
	schedulerapp "k8s.io/kubernetes/cmd/kube-scheduler/app"
	scheduleroptions "k8s.io/kubernetes/cmd/kube-scheduler/app/options"
)

const readyPrefix = "TANGRAM-CONTROLPLANE READY "

type settings struct {
	dataDir            string
	apiserverPort      int
	etcdPort           int
	etcdPeerPort       int
	schedulerPort      int
	controllerPort     int
	featureGates       string
	runtimeConfig      string
	controllers        string
	verbosity          int
	readyTimeout       time.Duration
	apiserverExtraArg  multiFlag
	controllerExtraArg multiFlag
	schedulerExtraArg  multiFlag
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, " ") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// paths are the files generated into the data directory.
type paths struct {
	pki, caCert, serverCert, serverKey, saKey, tokens, kubeconfig, etcd string
}

func newPaths(dir string) paths {
	pki := filepath.Join(dir, "pki")
	return paths{
		pki:        pki,
		caCert:     filepath.Join(pki, "ca.crt"),
		serverCert: filepath.Join(pki, "apiserver.crt"),
		serverKey:  filepath.Join(pki, "apiserver.key"),
		saKey:      filepath.Join(pki, "sa.key"),
		tokens:     filepath.Join(pki, "tokens.csv"),
		kubeconfig: filepath.Join(dir, "kubeconfig"),
		etcd:       filepath.Join(dir, "etcd"),
	}
}

func main() {
	var s settings
	flag.StringVar(&s.dataDir, "data-dir", "", "directory for etcd data, keys and the kubeconfig (required)")
	flag.IntVar(&s.apiserverPort, "apiserver-port", 0, "kube-apiserver secure port on 127.0.0.1 (required)")
	flag.IntVar(&s.etcdPort, "etcd-port", 0, "etcd client port on 127.0.0.1 (required)")
	flag.IntVar(&s.etcdPeerPort, "etcd-peer-port", 0, "etcd peer port on 127.0.0.1 (required)")
	flag.IntVar(&s.schedulerPort, "scheduler-port", 0, "kube-scheduler secure port on 127.0.0.1 (required)")
	flag.IntVar(&s.controllerPort, "controller-manager-port", 0, "kube-controller-manager secure port on 127.0.0.1 (required)")
	flag.StringVar(&s.featureGates, "feature-gates", "", "feature gates for every component, as kube-apiserver takes them")
	flag.StringVar(&s.runtimeConfig, "runtime-config", "", "kube-apiserver --runtime-config")
	flag.StringVar(&s.controllers, "controllers",
		"resourceclaim-controller,garbage-collector-controller,namespace-controller,disruption-controller",
		"kube-controller-manager --controllers")
	flag.IntVar(&s.verbosity, "v", 0, "log verbosity of the Kubernetes components")
	flag.DurationVar(&s.readyTimeout, "ready-timeout", 3*time.Minute, "give up when not ready within this time")
	flag.Var(&s.apiserverExtraArg, "apiserver-arg", "extra kube-apiserver flag, e.g. --apiserver-arg=--foo=bar (repeatable)")
	flag.Var(&s.controllerExtraArg, "controller-manager-arg", "extra kube-controller-manager flag (repeatable)")
	flag.Var(&s.schedulerExtraArg, "scheduler-arg", "extra kube-scheduler flag (repeatable)")
	flag.Parse()
	if err := run(s); err != nil {
		fmt.Fprintf(os.Stderr, "controlplane: %v\n", err)
		os.Exit(1)
	}
}

func run(s settings) error {
	if s.dataDir == "" {
		return errors.New("--data-dir is required")
	}
	for name, port := range map[string]int{
		"--apiserver-port": s.apiserverPort, "--etcd-port": s.etcdPort, "--etcd-peer-port": s.etcdPeerPort,
		"--scheduler-port": s.schedulerPort, "--controller-manager-port": s.controllerPort,
	} {
		if port <= 0 || port > 65535 {
			return fmt.Errorf("%s must be a port number, got %d", name, port)
		}
	}
	p := newPaths(s.dataDir)
	token, err := writeCredentials(p, s.apiserverPort)
	if err != nil {
		return fmt.Errorf("writing credentials: %w", err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	failed := make(chan error, 4)

	etcd, err := startEtcd(p.etcd, s.etcdPort, s.etcdPeerPort)
	if err != nil {
		return fmt.Errorf("starting etcd: %w", err)
	}
	defer etcd.Close()
	go func() {
		if err := <-etcd.Err(); err != nil {
			failed <- fmt.Errorf("etcd: %w", err)
		}
	}()

	logOptions := logsapi.NewLoggingConfiguration()
	logOptions.Verbosity = logsapi.VerbosityLevel(s.verbosity)
	if err := logsapi.ValidateAndApply(logOptions, utilfeature.DefaultFeatureGate); err != nil {
		return fmt.Errorf("logging: %w", err)
	}

	// Every component's flags are defined and parsed before any component starts: they share
	// one process-wide feature gate, and kube-controller-manager overrides a default on it,
	// which is refused once another component has added the gate to its flag set.
	startControllerManager, err := prepareControllerManager(s, p)
	if err != nil {
		return fmt.Errorf("kube-controller-manager: %w", err)
	}
	startScheduler, err := prepareScheduler(s, p)
	if err != nil {
		return fmt.Errorf("kube-scheduler: %w", err)
	}
	if err := startAPIServer(ctx, s, p, failed); err != nil {
		return fmt.Errorf("kube-apiserver: %w", err)
	}
	server := fmt.Sprintf("https://127.0.0.1:%d", s.apiserverPort)
	if err := waitHealthy(ctx, server+"/readyz", token, s.readyTimeout, failed); err != nil {
		return fmt.Errorf("kube-apiserver: %w", err)
	}
	if err := startControllerManager(ctx, failed); err != nil {
		return fmt.Errorf("kube-controller-manager: %w", err)
	}
	if err := startScheduler(ctx, failed); err != nil {
		return fmt.Errorf("kube-scheduler: %w", err)
	}
	for name, port := range map[string]int{"kube-controller-manager": s.controllerPort, "kube-scheduler": s.schedulerPort} {
		if err := waitHealthy(ctx, fmt.Sprintf("https://127.0.0.1:%d/healthz", port), "", s.readyTimeout, failed); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}

	ready, _ := json.Marshal(map[string]any{
		"server": server, "kubeconfig": p.kubeconfig, "ca": p.caCert, "token_file": filepath.Join(p.pki, "admin.token"),
		"etcd": fmt.Sprintf("http://127.0.0.1:%d", s.etcdPort), "pid": os.Getpid(),
	})
	fmt.Println(readyPrefix + string(ready))

	select {
	case <-ctx.Done():
		return nil
	case err := <-failed:
		return err
	}
}

// parse feeds args to the named flag sets a component defines, exactly as its
// own command line would.
func parse(name string, sets cliflag.NamedFlagSets, args []string) error {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	for _, set := range sets.FlagSets {
		fs.AddFlagSet(set)
	}
	return fs.Parse(args)
}

func startAPIServer(ctx context.Context, s settings, p paths, failed chan<- error) error {
	opts := apiserveroptions.NewServerRunOptions()
	args := []string{
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(s.apiserverPort),
		"--etcd-servers=" + fmt.Sprintf("http://127.0.0.1:%d", s.etcdPort),
		"--tls-cert-file=" + p.serverCert,
		"--tls-private-key-file=" + p.serverKey,
		"--client-ca-file=" + p.caCert,
		"--token-auth-file=" + p.tokens,
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + p.saKey,
		"--service-account-signing-key-file=" + p.saKey,
		"--service-cluster-ip-range=10.96.0.0/16",
		"--authorization-mode=RBAC",
		"--allow-privileged=true",
		// Pods in tests run in namespaces created a moment earlier; the
		// ServiceAccount admission plugin would refuse them until the
		// serviceaccount controller catches up, and no kubelet mounts tokens.
		"--disable-admission-plugins=ServiceAccount",
		"--endpoint-reconciler-type=none",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
	}
	if s.featureGates != "" {
		args = append(args, "--feature-gates="+s.featureGates)
	}
	if s.runtimeConfig != "" {
		args = append(args, "--runtime-config="+s.runtimeConfig)
	}
	args = append(args, s.apiserverExtraArg...)
	if err := parse("kube-apiserver", opts.Flags(), args); err != nil {
		return err
	}
	if err := opts.GenericServerRunOptions.ComponentGlobalsRegistry.Set(); err != nil {
		return err
	}
	completed, err := opts.Complete(ctx)
	if err != nil {
		return err
	}
	if errs := completed.Validate(); len(errs) != 0 {
		return utilerrors.NewAggregate(errs)
	}
	go func() {
		if err := apiserverapp.Run(ctx, completed); err != nil && ctx.Err() == nil {
			failed <- fmt.Errorf("kube-apiserver: %w", err)
		}
	}()
	return nil
}

func componentArgs(s settings, p paths, port int) []string {
	args := []string{
		"--kubeconfig=" + p.kubeconfig,
		"--authentication-kubeconfig=" + p.kubeconfig,
		"--authorization-kubeconfig=" + p.kubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--leader-elect=false",
	}
	if s.featureGates != "" {
		args = append(args, "--feature-gates="+s.featureGates)
	}
	return args
}

// starter starts a component whose flags were parsed already.
type starter func(ctx context.Context, failed chan<- error) error

func prepareControllerManager(s settings, p paths) (starter, error) {
	opts, err := kcmoptions.NewKubeControllerManagerOptions()
	if err != nil {
		return nil, err
	}
	known, disabled, aliases := kcmapp.KnownControllers(), kcmapp.ControllersDisabledByDefault(), kcmapp.ControllerAliases()
	args := append(componentArgs(s, p, s.controllerPort), "--controllers="+s.controllers, "--cert-dir="+filepath.Join(p.pki, "kcm"))
	args = append(args, s.controllerExtraArg...)
	if err := parse("kube-controller-manager", opts.Flags(known, disabled, aliases), args); err != nil {
		return nil, err
	}
	return func(ctx context.Context, failed chan<- error) error {
		if err := opts.ComponentGlobalsRegistry.Set(); err != nil {
			return err
		}
		config, err := opts.Config(ctx, known, disabled, aliases)
		if err != nil {
			return err
		}
		go func() {
			if err := kcmapp.Run(ctx, config.Complete()); err != nil && ctx.Err() == nil {
				failed <- fmt.Errorf("kube-controller-manager: %w", err)
			}
		}()
		return nil
	}, nil
}

func prepareScheduler(s settings, p paths) (starter, error) {
	opts := scheduleroptions.NewOptions()
	args := append(componentArgs(s, p, s.schedulerPort), "--cert-dir="+filepath.Join(p.pki, "scheduler"))
	args = append(args, s.schedulerExtraArg...)
	if err := parse("kube-scheduler", *opts.Flags, args); err != nil {
		return nil, err
	}
	return func(ctx context.Context, failed chan<- error) error {
		if err := opts.ComponentGlobalsRegistry.Set(); err != nil {
			return err
		}
		cc, sched, err := schedulerapp.Setup(ctx, opts)
		if err != nil {
			return err
		}
		go func() {
			if err := schedulerapp.Run(ctx, cc, sched); err != nil && ctx.Err() == nil {
				failed <- fmt.Errorf("kube-scheduler: %w", err)
			}
		}()
		return nil
	}, nil
}

func startEtcd(dir string, port, peerPort int) (*embed.Etcd, error) {
	cfg := embed.NewConfig()
	cfg.Name = "tangram"
	cfg.Dir = dir
	cfg.LogLevel = "error"
	client := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", port)}
	peer := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", peerPort)}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	// A test cluster's data is thrown away; fsync on every write only slows
	// every test on a loaded machine.
	cfg.UnsafeNoFsync = true
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, err
	}
	select {
	case <-e.Server.ReadyNotify():
		return e, nil
	case <-time.After(time.Minute):
		e.Close()
		return nil, errors.New("not ready within a minute")
	}
}

func waitHealthy(ctx context.Context, endpoint, token string, timeout time.Duration, failed <-chan error) error {
	client := &http.Client{
		Timeout: 5 * time.Second,
		// Health probes of components whose serving certificates are
		// self-signed at start; nothing secret travels on them.
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, //nolint:gosec
	}
	deadline := time.Now().Add(timeout)
	var last string
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, endpoint, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not healthy within %s (last: %s)", endpoint, timeout, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-failed:
			return err
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// writeCredentials generates a CA, the API server's serving certificate, the
// service-account signing key and an admin bearer token, and writes a
// kubeconfig that uses them.
//
// Started again on the same data directory (after a crash, say), it keeps the credentials it
// wrote before: clients holding the kubeconfig, and tokens signed with the service-account key,
// keep working against the restarted control plane.
func writeCredentials(p paths, apiserverPort int) (string, error) {
	if err := os.MkdirAll(p.pki, 0o700); err != nil {
		return "", err
	}
	if token, ok := existingCredentials(p); ok {
		return token, writeKubeconfig(p, apiserverPort, token)
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", err
	}
	now := time.Now()
	caTemplate := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "tangram-controlplane-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		return "", err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return "", err
	}
	serverKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", err
	}
	serverTemplate := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.96.0.1")},
	}
	serverDER, err := x509.CreateCertificate(rand.Reader, serverTemplate, caCert, &serverKey.PublicKey, caKey)
	if err != nil {
		return "", err
	}
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return "", err
	}
	tokenBytes := make([]byte, 24)
	if _, err := rand.Read(tokenBytes); err != nil {
		return "", err
	}
	token := hex.EncodeToString(tokenBytes)

	serverKeyDER, err := x509.MarshalECPrivateKey(serverKey)
	if err != nil {
		return "", err
	}
	files := map[string][]byte{
		p.caCert:     pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		p.serverCert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: serverDER}),
		p.serverKey:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: serverKeyDER}),
		p.saKey:      pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(saKey)}),
		// system:masters passes every authorization check, as a cluster admin's
		// credential does.
		p.tokens:                            []byte(fmt.Sprintf("%s,tangram-admin,tangram-admin,\"system:masters\"\n", token)),
		filepath.Join(p.pki, "admin.token"): []byte(token),
	}
	for path, data := range files {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return "", err
		}
	}
	if err := writeKubeconfig(p, apiserverPort, token); err != nil {
		return "", err
	}
	klog.V(1).InfoS("credentials written", "dir", p.pki)
	return token, nil
}

// existingCredentials is the admin token of credentials written by an earlier start, when every
// file of them is there.
func existingCredentials(p paths) (string, bool) {
	for _, path := range []string{p.caCert, p.serverCert, p.serverKey, p.saKey, p.tokens} {
		if _, err := os.Stat(path); err != nil {
			return "", false
		}
	}
	token, err := os.ReadFile(filepath.Join(p.pki, "admin.token"))
	if err != nil || len(token) == 0 {
		return "", false
	}
	return string(token), true
}

func writeKubeconfig(p paths, apiserverPort int, token string) error {
	kubeconfig := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: tangram
  cluster:
    server: https://127.0.0.1:%d
    certificate-authority: %s
users:
- name: tangram-admin
  user:
    token: %s
contexts:
- name: tangram
  context:
    cluster: tangram
    user: tangram-admin
current-context: tangram
`, apiserverPort, p.caCert, token)
	return os.WriteFile(p.kubeconfig, []byte(kubeconfig), 0o600)
}
