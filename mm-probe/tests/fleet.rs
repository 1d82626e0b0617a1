//! The fleet files, checked by real validators: the DaemonSet by kubernetes-validate (the
//! Kubernetes OpenAPI schemas, strict: unknown fields fail), the dashboard by tsc against the
//! dashboard and panel types Grafana publishes (`@grafana/schema`), every PromQL expression of
//! the dashboard by promtool, and every metric and label it reads against the exporter's
//! metric contract; and the exporter itself, run with only the capabilities the manifest grants.
//! `cargo xtask setup` installs the validators; on the host they must be there, inside the qemu
//! guests the tool checks are skipped, saying so (the contract checks need no tool and run
//! everywhere).

mod common;

use std::{
    collections::BTreeSet,
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
};

use serde_json::Value;

// Embedded, like the NDJSON schemas: the test binaries also run where the tree is not.
const DAEMONSET: &str = include_str!("../../deploy/kubernetes/mm-probe-daemonset.yaml");
const DASHBOARD: &str = include_str!("../../deploy/grafana/mm-probe-dashboard.json");

/// A metric of the contract the exporter is written against: its name, whether it is a
/// histogram (read through `_bucket`, `_sum`, `_count`), and its labels.
struct Metric {
    name: &'static str,
    histogram: bool,
    labels: &'static [&'static str],
}

const fn metric(name: &'static str, labels: &'static [&'static str]) -> Metric {
    Metric { name, histogram: false, labels }
}

const fn histogram(name: &'static str, labels: &'static [&'static str]) -> Metric {
    Metric { name, histogram: true, labels }
}

const CONTRACT: &[Metric] = &[
    metric("mm_probe_probe_attached", &["capability", "probe"]),
    metric("mm_probe_verdict", &["capability", "level"]),
    metric("mm_probe_finding", &["capability", "level", "metric"]),
    metric("mm_probe_lost_events_total", &["capability", "kind"]),
    metric("mm_probe_map_update_failures_total", &["capability", "map"]),
    metric("mm_probe_build_info", &["version", "kernel"]),
    histogram("mm_probe_wakeup_latency_seconds", &[]),
    metric("mm_probe_wakeups_over_threshold_total", &[]),
    histogram("mm_probe_function_duration_seconds", &["function"]),
    metric("mm_probe_function_calls_over_threshold_total", &["function"]),
    metric("mm_probe_hmm_range_fault_returns_total", &["result"]),
    metric("mm_probe_hmm_stale_sequence_retries_total", &[]),
    metric("mm_probe_mmu_invalidations_total", &["event"]),
    metric("mm_probe_mirrored_invalidation_causes_total", &["cause"]),
    histogram("mm_probe_mmu_invalidation_callback_seconds", &[]),
    metric("mm_probe_kvm_mmu_notifier_events_total", &["event"]),
    metric("mm_probe_invalidation_causes_total", &["source", "cause"]),
    metric("mm_probe_thp_checks_total", &["verdict", "reason"]),
];

/// Labels every scraped series has, whatever the exporter exports.
const TARGET_LABELS: &[&str] = &["instance", "job"];

/// Dashboard variables, replaced by what Grafana would send for "All" and a 1-minute step.
const VARIABLES: &[(&str, &str)] = &[("$node", ".*"), ("$__rate_interval", "5m")];

// ---------------------------------------------------------------------------------------------
// The validators

/// Where `cargo xtask setup` puts the validators (xtask/src/setup.rs, `data_dir`).
fn data_dir(name: &str) -> PathBuf {
    Path::new(&std::env::var("HOME").unwrap_or_default()).join(".local/share/mm-probe").join(name)
}

/// `path` on the host, where CI must run these checks: missing, it is a failure. Inside a qemu
/// guest, a skip: the files do not depend on the kernel, the guest may lack the validators, and
/// where it sees the host's (over 9p) it would only rerun the host's check, ten times slower
/// under emulation.
fn validator(path: PathBuf, what: &str) -> Option<PathBuf> {
    if let Some(kernel) = common::vm_kernel() {
        eprintln!("skipped on {kernel}: the check with {what} is of kernel-independent files and runs on the host");
        return None;
    }
    assert!(path.exists(), "{what} is missing ({}): run `cargo xtask setup`", path.display());
    Some(path)
}

fn kubernetes_validate() -> Option<PathBuf> {
    validator(data_dir("venv/bin/kubernetes-validate"), "kubernetes-validate")
}

fn venv_python() -> Option<PathBuf> {
    validator(data_dir("venv/bin/python"), "the validators' Python venv")
}

fn node_modules() -> Option<PathBuf> {
    validator(data_dir("node/node_modules"), "TypeScript and @grafana/schema")
}

fn promtool() -> Option<PathBuf> {
    validator(PathBuf::from("/usr/bin/promtool"), "promtool (Debian package prometheus)")
}

/// A fresh directory for this test's files.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mm-probe-fleet-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn run(command: &mut Command) -> Output {
    let output = command.output().unwrap_or_else(|e| panic!("starting {command:?}: {e}"));
    eprintln!("$ {command:?}\n{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    output
}

// ---------------------------------------------------------------------------------------------
// The DaemonSet

/// Whether kubernetes-validate, strict, accepts `manifest`.
fn kubernetes_accepts(tool: &Path, manifest: &str) -> bool {
    let file = scratch("manifest").join("mm-probe.yaml");
    std::fs::write(&file, manifest).unwrap();
    run(Command::new(tool).arg("--strict").arg(&file)).status.success()
}

#[test]
fn the_daemonset_passes_strict_kubernetes_validation() {
    let Some(tool) = kubernetes_validate() else { return };
    assert!(kubernetes_accepts(&tool, DAEMONSET), "deploy/kubernetes/mm-probe-daemonset.yaml is not valid Kubernetes");
    // The same check must notice a misspelled field, or it proves nothing.
    let misspelled = DAEMONSET.replace("readOnlyRootFilesystem", "readOnlyRootFileSystem");
    assert!(!kubernetes_accepts(&tool, &misspelled), "strict validation let an unknown field through");
}

/// The manifest's documents as JSON, read by the venv's YAML parser (kubernetes-validate's own).
fn manifest_documents(python: &Path) -> Vec<Value> {
    let file = scratch("yaml").join("mm-probe.yaml");
    std::fs::write(&file, DAEMONSET).unwrap();
    let script = "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))";
    let out = run(Command::new(python).args(["-c", script]).arg(&file));
    assert!(out.status.success(), "the manifest is not YAML");
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn the_agent_gets_only_the_capabilities_it_needs_and_listens_for_prometheus() {
    let Some(python) = venv_python() else { return };
    let documents = manifest_documents(&python);
    let daemonset = documents.iter().find(|d| d["kind"] == "DaemonSet").expect("a DaemonSet");
    let pod = &daemonset["spec"]["template"];
    assert_eq!(pod["spec"]["hostPID"], true, "the probes follow the node's pids");
    let container = &pod["spec"]["containers"][0];
    let security = &container["securityContext"];
    assert_eq!(security["capabilities"]["drop"], serde_json::json!(["ALL"]));
    assert_eq!(
        security["capabilities"]["add"],
        serde_json::json!(["BPF", "PERFMON"]),
        "nothing beyond CAP_BPF and CAP_PERFMON"
    );
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_ne!(security["privileged"], true);
    let args: Vec<&str> = container["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    assert_eq!(args, ["exporter", "--listen", "0.0.0.0:9479"], "the exporter's default address is loopback only");
    for (mount, path) in [("btf", "/sys/kernel/btf"), ("tracing", "/sys/kernel/tracing")] {
        let found = container["volumeMounts"].as_array().unwrap().iter().find(|m| m["name"] == mount);
        let found = found.unwrap_or_else(|| panic!("no {mount} mount"));
        assert_eq!((found["mountPath"].as_str(), found["readOnly"].as_bool()), (Some(path), Some(true)), "{found}");
    }
    let limits = &container["resources"]["limits"];
    assert!(limits["memory"].is_string() && container["resources"]["requests"]["memory"] == "50Mi", "{limits}");
    assert_eq!(pod["metadata"]["annotations"]["prometheus.io/port"], "9479");
    let service = documents.iter().find(|d| d["kind"] == "Service").expect("a Service");
    assert_eq!(service["spec"]["clusterIP"], "None", "headless: one endpoint per agent");
}

/// The capabilities the manifest adds to the container, as it spells them (`BPF`, …).
fn granted_capabilities(python: &Path) -> Vec<String> {
    let documents = manifest_documents(python);
    let daemonset = documents.iter().find(|d| d["kind"] == "DaemonSet").expect("a DaemonSet");
    let add = &daemonset["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]["add"];
    add.as_array().unwrap().iter().map(|c| c.as_str().unwrap().to_string()).collect()
}

/// The exporter on loopback, as root with every capability (`None`) or as the DaemonSet runs it
/// (`Some`): uid 0 with only those capabilities left in its bounding set, as the container
/// runtime leaves them, and no new privileges. Returns its `mm_probe_probe_attached` series.
fn probes_attached(capabilities: Option<&[String]>) -> Vec<String> {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut command = match capabilities {
        None => Command::new(common::mm_probe()),
        Some(granted) => {
            let keep: Vec<String> = granted.iter().map(|c| format!("+{}", c.to_lowercase())).collect();
            let mut setpriv = Command::new("setpriv");
            setpriv.arg(format!("--bounding-set=-all,{}", keep.join(",")));
            setpriv.args(["--inh-caps=-all", "--no-new-privs", "--"]).arg(common::mm_probe());
            setpriv
        }
    };
    let mut exporter = command
        .args(["exporter", "--listen", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting mm-probe exporter");
    let mut startup = String::new();
    BufReader::new(exporter.stdout.as_mut().unwrap()).read_line(&mut startup).unwrap();
    eprintln!("{startup}");
    let metrics = if startup.contains("listening") { scrape(port) } else { String::new() };
    common::interrupt(&exporter);
    assert!(exporter.wait().unwrap().success(), "the exporter failed: {startup}");
    metrics.lines().filter(|l| l.starts_with("mm_probe_probe_attached{")).map(str::to_string).collect()
}

/// GET /metrics in the classic text format (HTTP/1.0: the body ends with the connection).
fn scrape(port: u16) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connecting to the exporter");
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\nAccept: text/plain\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default()
}

/// The manifest's capability choice, tried on this kernel: with only what it grants, the
/// exporter attaches exactly the probes it attaches as full root. (This host runs 6.18, past
/// 5.11: BPF memory is charged to the memory cgroup, so no CAP_SYS_RESOURCE either.)
#[test]
fn with_only_the_manifests_capabilities_the_exporter_attaches_what_root_attaches() {
    common::require_root();
    let Some(python) = venv_python() else { return };
    let granted = granted_capabilities(&python);
    let as_root = probes_attached(None);
    assert!(as_root.iter().any(|p| p.ends_with(" 1")), "nothing attached even as root: {as_root:#?}");
    let as_deployed = probes_attached(Some(&granted));
    assert_eq!(as_deployed, as_root, "with only {granted:?} the exporter attaches less than as root");
}

// ---------------------------------------------------------------------------------------------
// The dashboard

fn dashboard() -> Value {
    serde_json::from_str(DASHBOARD).expect("the dashboard is JSON")
}

/// Every panel, rows' nested panels included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut all = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        all.push(panel);
        all.extend(panel["panels"].as_array().into_iter().flatten());
    }
    all
}

/// (panel id, refId, PromQL) of every query.
fn queries(dashboard: &Value) -> Vec<(u64, String, String)> {
    panels(dashboard)
        .into_iter()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten().map(move |t| (p, t)))
        .map(|(p, t)| {
            let expr = t["expr"].as_str().unwrap_or_else(|| panic!("a query without expr: {t}"));
            (p["id"].as_u64().unwrap(), t["refId"].as_str().unwrap().to_string(), expr.to_string())
        })
        .collect()
}

/// The panel plugins the dashboard uses, with the module of `@grafana/schema` that types their
/// options and field config.
const PANEL_TYPES: &[(&str, &str)] = &[
    ("timeseries", "timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen"),
    ("heatmap", "heatmap/panelcfg/x/HeatmapPanelCfg_types.gen"),
    ("stat", "stat/panelcfg/x/StatPanelCfg_types.gen"),
    ("table", "table/panelcfg/x/TablePanelCfg_types.gen"),
];

/// A TypeScript module that assigns the dashboard to Grafana's `Dashboard` type and each panel's
/// options and custom field config to its plugin's types. Object literals get TypeScript's
/// excess-property check, so an unknown or misspelled field fails like a missing one. `Json<T>`
/// turns the generated string enums into the string values the JSON holds.
fn dashboard_typescript(dashboard: &Value) -> String {
    let mut ts = String::from("import type { Dashboard } from '@grafana/schema';\n");
    for (i, (_, module)) in PANEL_TYPES.iter().enumerate() {
        ts += &format!("import type * as Plugin{i} from '@grafana/schema/dist/esm/raw/composable/{module}';\n");
    }
    ts += "type Json<T> = T extends string ? `${T}` : T extends number | boolean | null | undefined ? T\n";
    ts += "  : T extends ReadonlyArray<infer E> ? Array<Json<E>> : T extends object ? { [K in keyof T]: Json<T[K]> } : T;\n";
    ts += &format!("export const dashboard: Json<Dashboard> = {dashboard};\n");
    for panel in panels(dashboard).into_iter().filter(|p| p["type"] != "row") {
        let (id, kind) = (&panel["id"], panel["type"].as_str().unwrap());
        let plugin = PANEL_TYPES.iter().position(|(k, _)| *k == kind);
        let plugin =
            plugin.unwrap_or_else(|| panic!("panel {id}: add the types of panel plugin {kind} to PANEL_TYPES"));
        ts += &format!("export const options{id}: Json<Plugin{plugin}.Options> = {};\n", panel["options"]);
        let custom = &panel["fieldConfig"]["defaults"]["custom"];
        if !custom.is_null() {
            ts += &format!("export const custom{id}: Json<Plugin{plugin}.FieldConfig> = {custom};\n");
        }
    }
    ts
}

/// Whether tsc accepts `dashboard` against Grafana's types.
fn grafana_types_accept(node_modules: &Path, dashboard: &Value) -> bool {
    let dir = scratch("tsc");
    std::os::unix::fs::symlink(node_modules, dir.join("node_modules")).unwrap();
    std::fs::write(dir.join("dashboard.ts"), dashboard_typescript(dashboard)).unwrap();
    let tsc = node_modules.join(".bin/tsc");
    let flags = ["--noEmit", "--strict", "--target", "es2022", "--module", "esnext", "--moduleResolution", "bundler"];
    run(Command::new(tsc).args(flags).arg("dashboard.ts").current_dir(&dir)).status.success()
}

#[test]
fn the_dashboard_type_checks_against_grafanas_dashboard_and_panel_types() {
    let Some(node_modules) = node_modules() else { return };
    let dashboard = dashboard();
    assert!(
        grafana_types_accept(&node_modules, &dashboard),
        "deploy/grafana/mm-probe-dashboard.json breaks Grafana's types"
    );
    let mut misspelled = dashboard.clone();
    let stat = misspelled["panels"].as_array_mut().unwrap().iter_mut().find(|p| p["type"] == "stat").unwrap();
    stat["options"]["colorMode"] = "valu".into();
    assert!(!grafana_types_accept(&node_modules, &misspelled), "tsc let an unknown option value through");
}

/// A Prometheus rules file (JSON is YAML) with one recording rule per dashboard query.
fn rules_file(queries: &[(u64, String, String)]) -> String {
    let rules: Vec<Value> = queries
        .iter()
        .map(|(panel, ref_id, expr)| {
            let expr = VARIABLES.iter().fold(expr.clone(), |e, (variable, value)| e.replace(variable, value));
            serde_json::json!({ "record": format!("mm_probe_dashboard:panel_{panel}_{ref_id}"), "expr": expr })
        })
        .collect();
    serde_json::json!({ "groups": [{ "name": "mm-probe-dashboard", "rules": rules }] }).to_string()
}

#[test]
fn every_dashboard_query_parses_with_promtool() {
    let Some(promtool) = promtool() else { return };
    let queries = queries(&dashboard());
    let file = scratch("promql").join("dashboard-rules.yaml");
    std::fs::write(&file, rules_file(&queries)).unwrap();
    let out = run(Command::new(promtool).args(["check", "rules"]).arg(&file));
    assert!(out.status.success(), "promtool rejects a dashboard query");
    let found = format!("SUCCESS: {} rules found", queries.len());
    assert!(String::from_utf8_lossy(&out.stdout).contains(&found), "promtool did not check every query");
}

// ---------------------------------------------------------------------------------------------
// The dashboard against the metric contract (no tool needed)

/// The contract metric a series name belongs to (histograms through their three series).
fn contract_metric(series: &str) -> Option<&'static Metric> {
    CONTRACT.iter().find(|m| {
        series == m.name
            || (m.histogram && ["_bucket", "_sum", "_count"].iter().any(|s| series.strip_suffix(s) == Some(m.name)))
    })
}

/// Every `mm_probe_…` identifier of a PromQL expression.
fn series_names(expr: &str) -> Vec<&str> {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_';
    expr.match_indices("mm_probe_")
        .filter(|(at, _)| !expr[..*at].ends_with(is_name))
        .map(|(at, _)| {
            let rest = &expr[at..];
            &rest[..rest.find(|c: char| !is_name(c)).unwrap_or(rest.len())]
        })
        .collect()
}

/// Label names an expression groups by or matches on: `by (a, b)` and `{a="…", b=~"…"}`.
fn label_names(expr: &str) -> BTreeSet<&str> {
    let mut labels = BTreeSet::new();
    for (at, _) in expr.match_indices("by (") {
        let list = &expr[at + 4..];
        labels.extend(list[..list.find(')').unwrap()].split(',').map(str::trim));
    }
    for (at, _) in expr.match_indices('{') {
        let matchers = &expr[at + 1..];
        for matcher in matchers[..matchers.find('}').unwrap()].split(',') {
            labels.insert(matcher.split(['=', '!']).next().unwrap().trim());
        }
    }
    labels
}

#[test]
fn the_dashboard_reads_only_contract_metrics_and_their_labels_and_every_one_of_them() {
    let mut used = BTreeSet::new();
    for (panel, ref_id, expr) in queries(&dashboard()) {
        let metrics: Vec<&Metric> = series_names(&expr)
            .into_iter()
            .map(|s| {
                contract_metric(s)
                    .unwrap_or_else(|| panic!("panel {panel} {ref_id}: {s} is not in the metric contract"))
            })
            .collect();
        assert!(!metrics.is_empty(), "panel {panel} {ref_id} reads no mm-probe metric: {expr}");
        for label in label_names(&expr) {
            let known = TARGET_LABELS.contains(&label)
                || (label == "le" && metrics.iter().any(|m| m.histogram))
                || metrics.iter().any(|m| m.labels.contains(&label));
            assert!(known, "panel {panel} {ref_id}: label {label} is not one of its metrics' labels: {expr}");
        }
        used.extend(metrics.iter().map(|m| m.name));
    }
    let unused: Vec<&str> = CONTRACT.iter().map(|m| m.name).filter(|m| !used.contains(m)).collect();
    assert!(unused.is_empty(), "metrics of the contract no panel shows: {unused:?}");
}

#[test]
fn the_dashboard_takes_its_datasource_from_a_variable() {
    let dashboard = dashboard();
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    assert!(
        variables.iter().any(|v| v["type"] == "datasource" && v["name"] == "datasource" && v["query"] == "prometheus")
    );
    for panel in panels(&dashboard).into_iter().filter(|p| p["type"] != "row") {
        let sources = std::iter::once(&panel["datasource"])
            .chain(panel["targets"].as_array().unwrap().iter().map(|t| &t["datasource"]));
        for source in sources {
            assert_eq!(source["uid"], "${datasource}", "panel {}: {source}", panel["id"]);
        }
    }
}

#[test]
fn the_contract_helpers_read_promql_as_intended() {
    let expr = r#"histogram_quantile(0.99, sum by (function, le) (rate(mm_probe_function_duration_seconds_bucket{instance=~"$node"}[5m])))"#;
    assert_eq!(series_names(expr), ["mm_probe_function_duration_seconds_bucket"]);
    assert_eq!(label_names(expr), BTreeSet::from(["function", "instance", "le"]));
    assert!(contract_metric("mm_probe_function_duration_seconds_count").is_some());
    assert!(contract_metric("mm_probe_thp_checks_total_bucket").is_none(), "a counter has no buckets");
    assert!(contract_metric("mm_probe_thp_check_total").is_none());
}
