//! Plugins uploaded on their own (docs/serve.md, "Deploying a plugin"):
//! `weir ctl apply --plugin FILE` uploads a plugin from a folder the host
//! cannot see and sends the pipeline file naming it `sha256:<digest>`; the
//! pipeline runs exact and loads again after a restart; a tenant can
//! neither name nor upload into another tenant's plugins; a body that is
//! not what its path names is refused; an upload is kept for the apply
//! that follows it and while any pipeline file names it, and pruned once
//! nothing does.

use crate::common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::files_in;
use common::*;
use serde_json::Value;

const ACME: &str = "acme";
const GLOBEX: &str = "globex";
const PIPELINE: &str = "orders";
const SINK: &str = "lake";
/// The test host's default (`ServeHost::builder`).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// A pipeline file as an operator writes one, comments included, whose
/// sink names its plugin `plugin`.
fn pipeline_file(seed: u64, changes: u64, plugin: &str) -> String {
    format!(
        "# acme's orders into the lake, applied from an operator's checkout.
pipeline: {PIPELINE}
source:
  generator: {{ seed: {seed}, max_changes: {changes} }}
batch: {{ max_rows: 200, linger_ms: 20, heartbeat_ms: 200 }}
sinks:
  - name: {SINK}
    plugin: {plugin}    # built by CI
    blob_store: {{ url: lake }}   # under the tenant's root
"
    )
}

/// The file an upload of `wasm` is kept as.
fn kept_as(wasm: &[u8]) -> String {
    format!("{}.wasm", sha256_hex(wasm))
}

/// `version` of the positioned fixture: the same code under a new digest.
fn version(honest: &[u8], version: u8) -> Vec<u8> {
    with_custom_section(honest, "weir-test-version", &[version])
}

fn stdout(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn ctl_apply_uploads_a_plugin_the_host_cannot_see_and_the_pipeline_runs_and_reloads() {
    const SEED: u64 = 41;
    const CHANGES: u64 = 3_000;
    let mut host = ServeHost::builder().tenant(Tenant::new(ACME)).start();
    let token = host.token(ACME).to_string();
    let honest = std::fs::read(plugin("weir-fixture-positioned")).unwrap();
    let sha256 = sha256_hex(&honest);

    // The operator's checkout: a folder of its own, not the host's.
    let checkout = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(checkout.path().join("build")).unwrap();
    let wasm = checkout.path().join("build/lake.wasm");
    std::fs::write(&wasm, &honest).unwrap();
    let written = pipeline_file(SEED, CHANGES, "build/lake.wasm");
    let file = checkout.path().join("orders.yaml");
    std::fs::write(&file, &written).unwrap();

    let name = format!("{ACME}/{PIPELINE}");
    let args = [
        "apply",
        name.as_str(),
        file.to_str().unwrap(),
        "--plugin",
        wasm.to_str().unwrap(),
    ];
    let applied = host.ctl(&args, &token);
    assert!(applied.status.success(), "{}", text(&applied));
    let said = stdout(&applied);
    assert!(
        said.contains(&format!(
            "uploaded {}: sha256:{sha256}, {} bytes, for sink `{SINK}`",
            wasm.display(),
            honest.len()
        )),
        "{said}"
    );
    assert!(said.contains("acme/orders: applied"), "{said}");

    // The host keeps the file as sent: the reference in the value's place,
    // the comments and layout as written; no plugin was put beside it.
    let stored = host.pipelines_dir(ACME).join("orders.yaml");
    assert_eq!(
        std::fs::read_to_string(&stored).unwrap(),
        written.replace("build/lake.wasm", &format!("sha256:{sha256}"))
    );
    assert_eq!(files_in(&host.pipelines_dir(ACME)), ["orders.yaml"]);
    assert_eq!(files_in(&host.uploads_dir(ACME)), [kept_as(&honest)]);

    let finished = host.wait_for_state(ACME, PIPELINE, "finished", Duration::from_secs(120));
    assert_eq!(finished["plugins"][SINK]["sha256"], sha256, "{finished}");
    let runs = PathBuf::from(finished["plugins"][SINK]["path"].as_str().unwrap());
    assert!(
        runs.starts_with(host.uploads_dir(ACME).canonicalize().unwrap()),
        "the sink runs {} rather than the upload",
        runs.display()
    );
    let root = host.sink_root(ACME, PIPELINE, SINK);
    assert_positioned_exact(&root, &expected_state(SEED, CHANGES));

    // Applying it again uploads the same bytes again: nothing changes.
    let again = host.ctl(&args, &token);
    assert!(again.status.success(), "{}", text(&again));
    assert!(
        stdout(&again).contains("(the server had it already)")
            && stdout(&again).contains("nothing changed"),
        "{}",
        stdout(&again)
    );

    let as_json = host.ctl(&[&args[..], &["--json"]].concat(), &token);
    assert!(as_json.status.success(), "{}", text(&as_json));
    let reply: Value = serde_json::from_slice(&as_json.stdout)
        .unwrap_or_else(|e| panic!("--json prints one JSON document ({e}): {}", text(&as_json)));
    assert_eq!(reply["changed"], false, "{reply}");
    assert_eq!(reply["uploaded"][0]["sha256"], sha256.as_str(), "{reply}");
    assert_eq!(reply["uploaded"][0]["sinks"][0], SINK, "{reply}");
    assert_eq!(reply["uploaded"][0]["new"], false, "{reply}");

    // After a restart the pipeline file still loads: the upload is there.
    host.restart(SHUTDOWN_GRACE);
    let reloaded = host.wait_for_state(ACME, PIPELINE, "finished", Duration::from_secs(120));
    assert_eq!(reloaded["plugins"][SINK]["sha256"], sha256, "{reloaded}");
    let ready = host.get("/ready");
    assert_eq!(ready.code, 200, "{ready}");
    assert_eq!(files_in(&host.uploads_dir(ACME)), [kept_as(&honest)]);
    assert_positioned_exact(&root, &expected_state(SEED, CHANGES));
}

#[test]
fn a_tenant_can_neither_name_nor_upload_into_another_tenants_plugins_and_bad_uploads_are_refused() {
    let mut host = ServeHost::builder()
        .tenant(Tenant::new(ACME))
        .tenant(Tenant::new(GLOBEX))
        .start();
    let acme = host.token(ACME).to_string();
    let globex = host.token(GLOBEX).to_string();
    let honest = std::fs::read(plugin("weir-fixture-positioned")).unwrap();
    let sha256 = sha256_hex(&honest);
    let acme_uploads = host.uploads_dir(ACME);
    let globex_uploads = host.uploads_dir(GLOBEX);

    let first = host.upload_plugin(ACME, &sha256, &honest, &acme);
    assert_eq!(first.code, 200, "{first}");
    assert_eq!(first.json()["sha256"], sha256.as_str(), "{first}");
    assert_eq!(first.json()["size"], honest.len(), "{first}");
    assert_eq!(first.json()["new"], true, "{first}");
    let again = host.upload_plugin(ACME, &sha256, &honest, &acme);
    assert_eq!(again.code, 200, "the same bytes again: {again}");
    assert_eq!(again.json()["new"], false, "{again}");
    assert_eq!(files_in(&acme_uploads), [kept_as(&honest)]);

    // A body that is not what its path names is not kept, not even as a
    // temporary file.
    let other = version(&honest, 1);
    let mismatch = host.upload_plugin(ACME, &sha256_hex(&other), &honest, &acme);
    assert_eq!(mismatch.code, 400, "{mismatch}");
    for digest in [sha256.clone(), sha256_hex(&other)] {
        assert!(mismatch.error().contains(&digest), "{mismatch}");
    }
    let not_wasm = b"#!/bin/sh\necho not a plugin\n";
    let refused = host.upload_plugin(ACME, &sha256_hex(not_wasm), not_wasm, &acme);
    assert_eq!(refused.code, 400, "{refused}");
    assert!(refused.error().contains("not WebAssembly"), "{refused}");
    let short = host.upload_plugin(ACME, "abc", &honest, &acme);
    assert_eq!(short.code, 400, "{short}");
    assert!(short.error().contains("not a sha256 digest"), "{short}");
    assert_eq!(files_in(&acme_uploads), [kept_as(&honest)]);

    // Globex's token reaches no tenant but globex: its upload into acme is
    // answered as if acme did not exist, and lands nowhere.
    let into_acme = host.upload_plugin(ACME, &sha256_hex(&other), &other, &globex);
    assert_eq!(into_acme.code, 404, "{into_acme}");
    // Refused from its headers, before the body is read: a short one, so
    // the client is not cut off while it still sends.
    let no_token = host.upload_plugin(ACME, &sha256_hex(b"\0asm"), b"\0asm", "not-a-known-token");
    assert_eq!(no_token.code, 401, "{no_token}");
    assert_eq!(files_in(&acme_uploads), [kept_as(&honest)]);
    assert_eq!(files_in(&globex_uploads), Vec::<String>::new());
    // The same through `weir ctl apply --plugin`: refused, nothing applied.
    let checkout = tempfile::tempdir().unwrap();
    let wasm = checkout.path().join("lake.wasm");
    std::fs::write(&wasm, &other).unwrap();
    let file = checkout.path().join("orders.yaml");
    std::fs::write(&file, pipeline_file(1, 100, "lake.wasm")).unwrap();
    let through_ctl = host.ctl(
        &[
            "apply",
            "acme/orders",
            file.to_str().unwrap(),
            "--plugin",
            wasm.to_str().unwrap(),
        ],
        &globex,
    );
    assert!(!through_ctl.status.success(), "{}", text(&through_ctl));
    assert!(
        stderr(&through_ctl).contains("no tenant `acme`"),
        "{}",
        text(&through_ctl)
    );
    assert_eq!(files_in(&acme_uploads), [kept_as(&honest)]);
    assert_eq!(files_in(&globex_uploads), Vec::<String>::new());

    // Nor can globex name acme's upload: it has not uploaded it.
    let reference = format!("sha256:{sha256}");
    let named = pipeline_file(1, 100, &reference);
    let reply = host.put_pipeline(GLOBEX, PIPELINE, &named, &globex);
    assert_eq!(reply.code, 400, "{reply}");
    let sentence = format!(
        "sink `{SINK}` names the uploaded plugin {reference}, which tenant `{GLOBEX}` has not \
         uploaded; upload it with `weir ctl apply --plugin FILE`"
    );
    assert!(reply.error().contains(&sentence), "{reply}");
    assert_eq!(files_in(&host.pipelines_dir(GLOBEX)), Vec::<String>::new());
    // A digest acme never uploaded is refused to acme alike, through ctl.
    let unknown = sha256_hex(b"never uploaded");
    std::fs::write(&file, pipeline_file(1, 100, &format!("sha256:{unknown}"))).unwrap();
    let through_ctl = host.ctl(&["apply", "acme/orders", file.to_str().unwrap()], &acme);
    assert!(!through_ctl.status.success(), "{}", text(&through_ctl));
    assert!(
        stderr(&through_ctl).contains(&format!(
            "sink `{SINK}` names the uploaded plugin sha256:{unknown}, which tenant `{ACME}` has \
             not uploaded; upload it with `weir ctl apply --plugin FILE`"
        )),
        "{}",
        text(&through_ctl)
    );
    // The operator reaches every tenant, as on every other route.
    let by_operator = host.upload_plugin(GLOBEX, &sha256, &honest, host.operator_token());
    assert_eq!(by_operator.code, 200, "{by_operator}");
    assert_eq!(files_in(&globex_uploads), [kept_as(&honest)]);

    // An upload no file names yet is still held after a restart: pruning
    // (which another upload sets off) leaves it for its apply.
    host.restart(SHUTDOWN_GRACE);
    let acme = host.token(ACME).to_string();
    let later = version(&honest, 2);
    let reply = host.upload_plugin(ACME, &sha256_hex(&later), &later, &acme);
    assert_eq!(reply.code, 200, "{reply}");
    let mut expected = vec![kept_as(&honest), kept_as(&later)];
    expected.sort();
    assert_eq!(
        files_in(&acme_uploads),
        expected,
        "an upload held when the host stopped was pruned after its restart"
    );
}

#[test]
fn an_upload_is_held_for_its_apply_and_pruned_once_no_pipeline_file_names_it() {
    const SEED: u64 = 43;
    const CHANGES: u64 = 2_000;
    /// Long enough for the few requests between an upload and its apply on
    /// a busy machine; short enough to wait out.
    const HOLD: Duration = Duration::from_secs(4);
    let host = ServeHost::builder()
        .tenant(Tenant::new(ACME))
        .admin("upload_hold_ms", HOLD.as_millis() as u64)
        .start();
    let token = host.token(ACME).to_string();
    let uploads = host.uploads_dir(ACME);
    let honest = std::fs::read(plugin("weir-fixture-positioned")).unwrap();
    let sha256 = sha256_hex(&honest);
    let upload = |wasm: &[u8]| {
        let reply = host.upload_plugin(ACME, &sha256_hex(wasm), wasm, &token);
        assert_eq!(reply.code, 200, "{reply}");
    };

    // The plugin the pipeline will run, uploaded first; then two uploads
    // and a refused apply, each of which prunes the tenant's uploads.
    let uploaded = Instant::now();
    upload(&honest);
    let drafted = version(&honest, 1);
    let abandoned = version(&honest, 2);
    upload(&drafted);
    upload(&abandoned);
    let unknown = sha256_hex(b"never uploaded");
    let refused = host.put_pipeline(
        ACME,
        "probe",
        &pipeline_file(SEED, CHANGES, &format!("sha256:{unknown}"))
            .replace(&format!("pipeline: {PIPELINE}"), "pipeline: probe"),
        &token,
    );
    assert_eq!(refused.code, 400, "{refused}");
    assert!(
        refused
            .error()
            .contains(&format!("names the uploaded plugin sha256:{unknown}")),
        "{refused}"
    );
    assert!(
        uploaded.elapsed() < HOLD,
        "inconclusive: the requests took {:?}, past the hold of {HOLD:?}",
        uploaded.elapsed()
    );
    let mut all = vec![kept_as(&honest), kept_as(&drafted), kept_as(&abandoned)];
    all.sort();
    assert_eq!(
        files_in(&uploads),
        all,
        "an upload was pruned before its apply"
    );

    // The apply that follows names it, without uploading it again.
    let reply = host.put_pipeline(
        ACME,
        PIPELINE,
        &pipeline_file(SEED, CHANGES, &format!("sha256:{sha256}")),
        &token,
    );
    assert_eq!(reply.code, 200, "{reply}");
    host.wait_for_state(ACME, PIPELINE, "finished", Duration::from_secs(120));
    assert_positioned_exact(
        &host.sink_root(ACME, PIPELINE, SINK),
        &expected_state(SEED, CHANGES),
    );

    // A pipeline file the host refuses still names an upload: kept.
    let draft = host.pipelines_dir(ACME).join("draft.yaml");
    let draft_text = pipeline_file(SEED, CHANGES, &format!("sha256:{}", sha256_hex(&drafted)))
        .replace(&format!("pipeline: {PIPELINE}"), "pipeline: draft")
        + "retries_everywhere: true   # not a key: the host refuses the file\n";
    std::fs::write(&draft, draft_text).unwrap();

    // Past every hold, the next prune (an upload sets it off) removes the
    // upload nothing names, and keeps what the pipeline runs and its file
    // names, and what the refused file names.
    std::thread::sleep(HOLD.saturating_sub(uploaded.elapsed()) + Duration::from_millis(500));
    let next = version(&honest, 3);
    upload(&next);
    let mut kept = vec![kept_as(&honest), kept_as(&drafted), kept_as(&next)];
    kept.sort();
    assert_eq!(
        files_in(&uploads),
        kept,
        "past its hold, only the upload no file names is pruned"
    );
    let listed = host.list(&token).json();
    let rejected: Vec<&Value> = listed["rejected"].as_array().unwrap().iter().collect();
    assert!(
        rejected
            .iter()
            .any(|r| r["file"].as_str().unwrap().ends_with("draft.yaml")),
        "the draft was not refused, so it proves nothing: {listed}"
    );

    // Deleted, the pipeline and its file no longer keep its plugin; the
    // draft's, once the draft is gone, goes at the next prune.
    let reply = host.delete(ACME, PIPELINE, &token);
    assert!(reply.is_success(), "{reply}");
    let mut kept = vec![kept_as(&drafted), kept_as(&next)];
    kept.sort();
    assert_eq!(files_in(&uploads), kept, "after the pipeline's delete");
    std::fs::remove_file(&draft).unwrap();
    let refused = host.put_pipeline(ACME, "probe", "pipeline: probe\n", &token);
    assert_eq!(refused.code, 400, "{refused}");
    assert_eq!(
        files_in(&uploads),
        [kept_as(&next)],
        "after the draft was removed"
    );
}

#[test]
fn weir_run_refuses_an_uploaded_plugin_reference() {
    let dir = tempfile::tempdir().unwrap();
    let reference = format!("sha256:{}", sha256_hex(b"a plugin"));
    let written = pipeline_file(1, 100, &reference) + "state_dir: state\n";
    let file = dir.path().join("orders.yaml");
    std::fs::write(&file, written).unwrap();
    let run = weir(&["run", file.to_str().unwrap()], &[]);
    assert!(!run.status.success(), "{}", text(&run));
    assert!(
        stderr(&run).contains(&format!(
            "sinks[0].plugin (sink `{SINK}`): `{reference}`: a sha256: plugin reference names a \
             plugin uploaded to weir serve; give weir run a file path"
        )),
        "{}",
        text(&run)
    );
    assert!(
        !dir.path().join("state").exists(),
        "the run made its state before refusing"
    );
}
