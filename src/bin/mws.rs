//! `mws`: the operator CLI of mooncake-weight-store (see `mws --help`).
//!
//! Exit status: 0 when the command succeeded and everything it checked holds; 1 when
//! it ran but found problems (`verify`, `gc` failures); 2 for usage errors, a bad
//! store path, a missing key or an invalid manifest.

use clap::{Parser, Subcommand};
use mooncake_weight_store::model::{Placement, StoredManifest};
use mooncake_weight_store::plan::load::{LogicalLoadPlan, PlanningLimits};
use mooncake_weight_store::protocol::integrity::verify_revision;
use mooncake_weight_store::protocol::load::load_manifest_limited;
use mooncake_weight_store::protocol::operator::{gc, survey, GcOptions};
use mooncake_weight_store::store::directory::DirectoryStore;
use mooncake_weight_store::store::{ObjectStore, DEFAULT_MAX_METADATA_BYTES};
use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::Arc;

const EXAMPLES: &str = "\
Examples:
  mws --dir /var/lib/weights ls
  mws --dir /var/lib/weights inspect weights/default/my-model/rev-1/1/manifest
  mws --dir /var/lib/weights inspect weights/default/my-model/rev-1/1 --json | jq .tensors
  mws --dir /var/lib/weights ls --json | jq '.revisions[].manifest_key'
  mws --dir /var/lib/weights verify weights/default/my-model/rev-1/1
  mws --dir /var/lib/weights gc --dry-run --older-than 2h
  mws --dir /var/lib/weights plan weights/default/my-model/rev-1/1 --target serving-placement.json

KEY is a manifest key (<prefix>/<namespace>/<resource>/<revision>/<generation>/manifest)
or its group id (the same without /manifest).

Exit status: 0 everything holds; 1 problems found (verify, gc failures);
2 usage error, bad store path, missing key or invalid manifest.";

/// Inspect, verify and clean a mooncake-weight-store store.
#[derive(Parser)]
#[command(name = "mws", version, about, after_help = EXAMPLES)]
struct Cli {
    /// Root of a directory store (a directory holding MOONCAKE_WEIGHT_STORE, objects/, tmp/).
    #[arg(long, value_name = "PATH")]
    dir: std::path::PathBuf,
    /// Largest manifest or decision record read, in bytes.
    #[arg(long, default_value_t = DEFAULT_MAX_METADATA_BYTES)]
    max_metadata_bytes: u64,
    /// Machine-readable output (one JSON document on stdout), for every command.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Resources, revisions, generations and their transactions: state and sizes.
    Ls {
        /// Only keys starting with this prefix.
        #[arg(long, default_value = "")]
        prefix: String,
    },
    /// Tensors, shapes, dtypes and fragments of one revision.
    Inspect {
        /// Manifest key or group id.
        key: String,
    },
    /// Checks every payload: present, right size, every 1 MiB block's CRC-32C.
    Verify {
        /// Manifest key or group id.
        key: String,
    },
    /// Finalizes undecided transactions and removes payloads of aborted or
    /// never-committed uploads; never touches a committed revision.
    Gc {
        /// Print what would be done; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Abort undecided uploads only when their newest object is older than this
        /// (e.g. 90s, 30m, 2h, 7d).
        #[arg(long, default_value = "24h", value_parser = parse_duration)]
        older_than: u64,
        /// Only keys starting with this prefix.
        #[arg(long, default_value = "")]
        prefix: String,
    },
    /// What a restore into a target placement would move.
    Plan {
        /// Manifest key or group id.
        key: String,
        /// Target placement JSON (address-free, `wire-format.md` §2.1).
        #[arg(long, value_name = "PLACEMENT.json")]
        target: std::path::PathBuf,
    },
}

fn parse_duration(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mul) = match s.char_indices().last() {
        Some((i, 's')) => (&s[..i], 1),
        Some((i, 'm')) => (&s[..i], 60),
        Some((i, 'h')) => (&s[..i], 3600),
        Some((i, 'd')) => (&s[..i], 86400),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .ok_or_else(|| format!("invalid duration {s:?} (use e.g. 90s, 30m, 2h, 7d)"))
}

fn human(n: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}

/// A progress bar on stderr (only on a terminal, for work of at least 64 MiB).
struct Bar {
    total: u64,
    on: bool,
    last: std::time::Instant,
}

impl Bar {
    fn new(total: u64) -> Bar {
        Bar { total, on: std::io::stderr().is_terminal() && total >= 64 << 20, last: std::time::Instant::now() }
    }
    /// Draws the bar at `done` (throttled to every 100 ms); the 100% line is drawn
    /// once, however often the end is reported.
    fn update(&mut self, done: u64) -> bool {
        if !self.on || (done < self.total && self.last.elapsed().as_millis() < 100) {
            return false;
        }
        if done >= self.total {
            self.on = false; // the final line: nothing is drawn after it
        }
        self.last = std::time::Instant::now();
        let f = done as f64 / self.total.max(1) as f64;
        let w = 30usize;
        let fill = ((f * w as f64) as usize).min(w);
        eprint!(
            "\r[{}{}] {:5.1}% {} / {}",
            "#".repeat(fill),
            " ".repeat(w - fill),
            f * 100.0,
            human(done),
            human(self.total)
        );
        if done >= self.total {
            eprintln!();
        }
        let _ = std::io::stderr().flush();
        true
    }
}

fn manifest_key(key: &str) -> String {
    let k = key.trim_end_matches('/');
    if k.ends_with("/manifest") {
        k.to_string()
    } else {
        format!("{k}/manifest")
    }
}

struct Fail(u8, String);

impl<E: std::fmt::Display> From<E> for Fail {
    fn from(e: E) -> Self {
        Fail(2, e.to_string())
    }
}

fn open(cli: &Cli) -> Result<DirectoryStore, Fail> {
    match DirectoryStore::is_store_root(&cli.dir) {
        Ok(true) => {}
        Ok(false) => {
            return Err(Fail(
                2,
                format!(
                "{} is not a mooncake-weight-store directory store (no MOONCAKE_WEIGHT_STORE marker, or other entries)",
                cli.dir.display()
            ),
            ))
        }
        Err(e) => return Err(Fail(2, e.to_string())),
    }
    Ok(DirectoryStore::open(&cli.dir)?)
}

/// The manifest at `key` (a manifest key or its group id), read with the CLI's
/// `--max-metadata-bytes` limit.
fn read_manifest(cli: &Cli, store: &dyn ObjectStore, key: &str) -> Result<StoredManifest, Fail> {
    let k = manifest_key(key);
    load_manifest_limited(store, &k, cli.max_metadata_bytes).map_err(|e| Fail(2, e.to_string()))
}

fn ls(cli: &Cli, store: &DirectoryStore, prefix: &str) -> Result<u8, Fail> {
    let s = survey(store, prefix, cli.max_metadata_bytes)?;
    let cleaned: usize = s.groups.iter().map(|g| g.transactions.iter().filter(|t| t.is_cleaned()).count()).sum();
    if cli.json {
        let groups: Vec<serde_json::Value> = s
            .groups
            .iter()
            .map(|g| {
                let txs: Vec<serde_json::Value> = g
                    .transactions
                    .iter()
                    .filter(|t| !t.is_cleaned())
                    .map(|t| {
                        serde_json::json!({"id": t.id, "state": t.state.as_str(), "payloads": t.payloads.len(),
                                           "payload_bytes": t.payload_bytes(), "integrity": t.integrity_key.is_some()})
                    })
                    .collect();
                let m = g.manifest.as_ref().map(|m| {
                    serde_json::json!({"manifest_key": m.manifest_key(), "namespace": m.namespace(),
                        "resource_id": m.resource_id(), "revision": m.revision(),
                        "weight_generation": m.weight_generation(), "created_at": m.created_at(),
                        "tensors": m.tensors().len(), "fragments": m.fragments().len(),
                        "bytes": m.fragments().iter().map(|f| f.nbytes()).sum::<u64>()})
                });
                serde_json::json!({"group_id": g.group_id, "revision": m, "manifest_error": g.manifest_error,
                                   "transactions": txs})
            })
            .collect();
        let revisions: Vec<&serde_json::Value> =
            groups.iter().filter_map(|g| g.get("revision").filter(|r| !r.is_null())).collect();
        let other: Vec<serde_json::Value> =
            s.other.iter().map(|(k, n)| serde_json::json!({"key": k, "bytes": n})).collect();
        let v = serde_json::json!({"prefix": prefix, "revisions": revisions, "groups": groups, "other": other,
                                   "cleaned_transactions": cleaned});
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(0);
    }
    if s.groups.is_empty() && s.other.is_empty() {
        if prefix.is_empty() {
            println!("(empty store)");
        } else {
            println!("no key of this store starts with {prefix:?}");
        }
    }
    for g in &s.groups {
        match (&g.manifest, &g.manifest_error) {
            (Some(m), _) => {
                let bytes: u64 = m.fragments().iter().map(|f| f.nbytes()).sum();
                println!(
                    "{}  resource={} revision={} generation={} committed {} tensors {} fragments {}",
                    g.group_id,
                    m.resource_id(),
                    m.revision(),
                    m.weight_generation(),
                    m.tensors().len(),
                    m.fragments().len(),
                    human(bytes)
                );
            }
            (None, Some(e)) => println!("{}  INVALID MANIFEST: {e}", g.group_id),
            (None, None) => println!("{}  (no manifest)", g.group_id),
        }
        for t in g.transactions.iter().filter(|t| !t.is_cleaned()) {
            println!(
                "  tx {}  {:<14} {:>5} payloads {:>10}{}",
                t.id,
                t.state.as_str(),
                t.payloads.len(),
                human(t.payload_bytes()),
                if t.integrity_key.is_some() { "  integrity" } else { "" }
            );
        }
    }
    if cleaned > 0 {
        println!("({cleaned} cleaned transaction(s) not shown: gc removed their payloads, their decisions stay)");
    }
    if !s.other.is_empty() {
        println!("other keys ({}):", s.other.len());
        for (k, n) in &s.other {
            println!("  {k}  {}", human(*n));
        }
    }
    Ok(0)
}

fn inspect(cli: &Cli, store: &DirectoryStore, key: &str) -> Result<u8, Fail> {
    let json = cli.json;
    let m = read_manifest(cli, store, key)?;
    let record =
        mooncake_weight_store::protocol::integrity::read_record(store, &m, cli.max_metadata_bytes).ok().flatten();
    if json {
        let tensors: Vec<serde_json::Value> = m
            .tensors()
            .iter()
            .map(|t| serde_json::json!({"tensor_id": t.tensor_id(), "shape": t.global_shape(), "dtype": t.dtype()}))
            .collect();
        let fragments: Vec<serde_json::Value> = m
            .fragments()
            .iter()
            .map(|f| {
                serde_json::json!({
                    "fragment_id": f.fragment_id(), "tensor_id": f.tensor_id(),
                    "global_offset": f.global_offset(), "local_shape": f.local_shape(),
                    "nbytes": f.nbytes(), "object_key": f.object_key(), "object_offset": f.object_offset(),
                })
            })
            .collect();
        let v = serde_json::json!({
            "manifest_key": m.manifest_key(), "group_id": m.group_id(), "namespace": m.namespace(),
            "resource_id": m.resource_id(), "revision": m.revision(), "weight_generation": m.weight_generation(),
            "manifest_digest": m.manifest_digest(), "created_at": m.created_at(),
            "bytes": m.fragments().iter().map(|f| f.nbytes()).sum::<u64>(),
            "integrity_record": record.is_some(),
            "tensors": tensors, "fragments": fragments,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(0);
    }
    println!("manifest   {}", m.manifest_key());
    println!("resource   {}  revision {}  generation {}", m.resource_id(), m.revision(), m.weight_generation());
    println!("created    {}  digest {}", m.created_at(), m.manifest_digest());
    println!("integrity  {}", if record.is_some() { "CRC-32C per 1 MiB block" } else { "none (unverified revision)" });
    let mut per_tensor: BTreeMap<&str, Vec<_>> = BTreeMap::new();
    for f in m.fragments() {
        per_tensor.entry(f.tensor_id()).or_default().push(f);
    }
    let bytes: u64 = m.fragments().iter().map(|f| f.nbytes()).sum();
    println!("{} tensors, {} fragments, {}", m.tensors().len(), m.fragments().len(), human(bytes));
    for t in m.tensors() {
        println!("  {}  {} {:?}", t.tensor_id(), t.dtype(), t.global_shape());
        for f in per_tensor.get(t.tensor_id()).map(|v| v.as_slice()).unwrap_or(&[]) {
            println!(
                "    fragment {}  offset {:?} shape {:?}  {}",
                f.fragment_id(),
                f.global_offset(),
                f.local_shape(),
                human(f.nbytes())
            );
        }
    }
    Ok(0)
}

fn verify(cli: &Cli, store: &DirectoryStore, key: &str) -> Result<u8, Fail> {
    let m = read_manifest(cli, store, key)?;
    let total: u64 = m.fragments().iter().map(|f| f.nbytes()).sum();
    let mut bar = Bar::new(if cli.json { 0 } else { total });
    let r = verify_revision(store, &m, cli.max_metadata_bytes, &mut |done| {
        bar.update(done);
    })?;
    bar.update(total);
    if cli.json {
        let problems: Vec<serde_json::Value> = r
            .problems
            .iter()
            .map(|p| serde_json::json!({"fragment_id": p.fragment_id, "kind": p.kind.name(), "message": p.message}))
            .collect();
        let v = serde_json::json!({"manifest_key": m.manifest_key(), "ok": r.problems.is_empty(),
            "integrity_record": r.has_record, "objects": r.objects, "bytes_verified": r.bytes_verified,
            "problems": problems});
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(if r.problems.is_empty() { 0 } else { 1 });
    }
    if !r.has_record {
        println!("note: {} has no integrity record; only presence and sizes were checked", m.manifest_key());
    }
    if r.problems.is_empty() {
        println!("ok: {} objects, {} verified", r.objects, human(r.bytes_verified));
        return Ok(0);
    }
    for p in &r.problems {
        println!("FAIL fragment {} ({}): {}", p.fragment_id, p.kind.name(), p.message);
    }
    println!("{} problem(s) in {} objects", r.problems.len(), r.objects);
    Ok(1)
}

fn run_gc(cli: &Cli, store: &DirectoryStore, dry_run: bool, older_than: u64, prefix: &str) -> Result<u8, Fail> {
    let s = survey(store, prefix, cli.max_metadata_bytes)?;
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    let mtime = |k: &str| store.object_mtime(k);
    let r = gc(store, &s, &GcOptions { dry_run, older_than_secs: older_than, mtime: &mtime, now_secs: now });
    let temps =
        if dry_run { 0 } else { store.clean_temp_older_than(std::time::Duration::from_secs(older_than.max(3600)))? };
    let freed: u64 = r.actions.iter().map(|a| a.bytes).sum();
    if cli.json {
        let actions: Vec<serde_json::Value> = r
            .actions
            .iter()
            .map(|a| {
                serde_json::json!({"group_id": a.group_id, "transaction_id": a.transaction_id, "what": a.what,
                                   "removed": a.removed, "bytes": a.bytes})
            })
            .collect();
        let kept: Vec<serde_json::Value> = r
            .kept
            .iter()
            .map(|(g, t, why)| serde_json::json!({"group_id": g, "transaction_id": t, "why": why}))
            .collect();
        let failures: Vec<serde_json::Value> =
            r.failures.iter().map(|(k, e)| serde_json::json!({"key": k, "error": e})).collect();
        let v = serde_json::json!({"dry_run": dry_run, "actions": actions, "kept": kept, "failures": failures,
            "already_cleaned": r.already_cleaned, "bytes": freed, "stale_temporary_files_removed": temps});
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(if r.failures.is_empty() { 0 } else { 1 });
    }
    let verb = if dry_run { "would remove" } else { "removed" };
    for a in &r.actions {
        println!(
            "{} tx {}: {} ({verb} {} objects, {})",
            a.group_id,
            a.transaction_id,
            a.what,
            a.removed.len(),
            human(a.bytes)
        );
        for k in &a.removed {
            println!("    {k}");
        }
    }
    for (g, t, why) in &r.kept {
        println!("{g} tx {t}: kept: {why}");
    }
    if temps > 0 {
        println!("removed {temps} stale temporary files");
    }
    for (k, e) in &r.failures {
        println!("FAIL {k}: {e}");
    }
    if r.already_cleaned > 0 {
        println!("{} transaction(s) already cleaned by an earlier run", r.already_cleaned);
    }
    if dry_run {
        println!("{} action(s) would free {} (dry run: nothing was changed)", r.actions.len(), human(freed));
    } else {
        println!("{} action(s), {} freed", r.actions.len(), human(freed));
    }
    Ok(if r.failures.is_empty() { 0 } else { 1 })
}

fn plan(cli: &Cli, store: &DirectoryStore, key: &str, target: &std::path::Path) -> Result<u8, Fail> {
    let m = Arc::new(read_manifest(cli, store, key)?);
    let bytes = std::fs::read(target)
        .map_err(|e| Fail(2, format!("cannot read target placement {}: {e}", target.display())))?;
    let placement = Placement::from_json(&bytes)
        .map_err(|e| Fail(2, format!("invalid target placement {}: {}", target.display(), e.message())))?;
    let p = LogicalLoadPlan::plan(m.clone(), Arc::new(placement), PlanningLimits::default())
        .map_err(|e| Fail(2, format!("cannot plan a restore into {}: {}", target.display(), e.message())))?;
    let mut per_participant: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    // target fragment -> (participant, [(stored fragment, bytes)])
    let mut feeds: BTreeMap<(&str, &str), BTreeMap<&str, u64>> = BTreeMap::new();
    for r in p.regions() {
        let part = p.target_participant_of(r);
        let e = per_participant.entry(part).or_default();
        e.0 += 1;
        e.1 += r.total_bytes();
        let t = p.target_of(r);
        *feeds
            .entry((part, t.placement_fragment_id()))
            .or_default()
            .entry(p.source_of(r).fragment_id())
            .or_default() += r.total_bytes();
    }
    if cli.json {
        let parts: Vec<serde_json::Value> = per_participant
            .iter()
            .map(|(part, (n, b))| serde_json::json!({"participant_id": part, "regions": n, "bytes": b}))
            .collect();
        let feeds: Vec<serde_json::Value> = feeds
            .iter()
            .map(|((part, tf), srcs)| {
                let from: Vec<serde_json::Value> =
                    srcs.iter().map(|(s, b)| serde_json::json!({"stored_fragment": s, "bytes": b})).collect();
                serde_json::json!({"participant_id": part, "target_fragment": tf, "from": from})
            })
            .collect();
        let v = serde_json::json!({"manifest_key": m.manifest_key(), "target": target.display().to_string(),
            "regions": p.regions().len(), "segments": p.total_segments(), "bytes": p.total_bytes(),
            "participants": parts, "target_fragments": feeds});
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(0);
    }
    println!("restore of {} into {}", m.manifest_key(), target.display());
    println!("{} regions, {} segments, {}", p.regions().len(), p.total_segments(), human(p.total_bytes()));
    println!("per target participant:");
    for (part, (n, b)) in &per_participant {
        println!("  {part}: {n} regions, {}", human(*b));
    }
    println!("stored fragments -> target fragments:");
    let mut last = "";
    for ((part, tf), srcs) in &feeds {
        if *part != last {
            println!("  {part}");
            last = part;
        }
        let list: Vec<String> = srcs.iter().map(|(s, b)| format!("{s} ({})", human(*b))).collect();
        println!("    {tf} <= {}", list.join(" + "));
    }
    Ok(0)
}

fn main() -> ExitCode {
    // Like other Unix tools, end quietly when the reader of stdout goes away
    // (`mws ls | head`) instead of panicking on EPIPE.
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    let result = open(&cli).and_then(|store| match &cli.command {
        Command::Ls { prefix } => ls(&cli, &store, prefix),
        Command::Inspect { key } => inspect(&cli, &store, key),
        Command::Verify { key } => verify(&cli, &store, key),
        Command::Gc { dry_run, older_than, prefix } => run_gc(&cli, &store, *dry_run, *older_than, prefix),
        Command::Plan { key, target } => plan(&cli, &store, key, target),
    });
    match result {
        Ok(code) => ExitCode::from(code),
        Err(Fail(code, msg)) => {
            if cli.json {
                println!("{}", serde_json::json!({"error": msg, "exit_status": code}));
            } else {
                eprintln!("mws: error: {msg}");
            }
            ExitCode::from(code)
        }
    }
}

/// A command line clap refuses (or `--help` / `--version`): with `--json` anywhere
/// among the arguments, one JSON document on stdout (`{"error": ..., "exit_status":
/// 2}`) as for every other failure; otherwise clap's own text.
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    let json = std::env::args_os().skip(1).any(|a| a == "--json");
    if !json || matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        e.exit();
    }
    let rendered = e.render().to_string();
    let message = rendered.lines().next().unwrap_or_default().trim_start_matches("error: ");
    println!("{}", serde_json::json!({"error": message, "exit_status": 2}));
    ExitCode::from(2)
}

#[cfg(test)]
mod tests {
    use super::Bar;

    #[test]
    fn the_final_progress_line_is_drawn_once() {
        let mut bar = Bar { total: 100, on: true, last: std::time::Instant::now() };
        assert!(!bar.update(50), "throttled: less than 100 ms after the start");
        assert!(bar.update(100), "the end is drawn");
        assert!(!bar.update(100), "and never again (the verify callback and the caller both report the end)");
        assert!(!bar.update(100));
    }
}
