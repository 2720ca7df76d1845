//! Redis sink: row changes as Redis hashes and streams, exactly once.
//!
//! `write` renders a batch into Redis changes and stages them per table;
//! `commit` applies everything staged for the table together with the
//! table's position and epoch in one Lua script (`src/commit.lua`), which
//! Redis runs as one atomic step:
//!
//! - upsert tables: an insert, update or read replaces the hash at the row's
//!   key (`DEL` then `HSET` of the non-null columns); a delete is `DEL`;
//! - append tables (and tables without a key): each change is one entry
//!   of the table's stream (`XADD`);
//! - the position hash `<prefix>:__weir:<pipeline>:<table>` gets `position`
//!   (hex) and `epoch`, and the script refuses a commit whose epoch is below
//!   the stored one (fenced) before it writes anything.
//!
//! A commit at or before the stored position was applied already (a lost
//! reply, a replay): the script writes no data for it and answers success,
//! so retrying a commit never applies it twice.
//!
//! Key layout in [`keys`], value rendering in [`render`]; the operator's
//! guide is docs/sinks/redis.md.

mod changes;
mod config;
pub mod keys;
mod link;
pub mod render;

use std::collections::HashMap;
use std::sync::OnceLock;

use redis::{Script, Value};
use weir_sdk::{Batch, CommitRequest, Committed, Config, Positions, Result, Sink, SinkError, log};

use crate::changes::{Change, Staged};
use crate::config::Settings;
use crate::keys::Layout;
use crate::link::Link;
pub use crate::link::connect;

/// The commit script's source.
const COMMIT_LUA: &str = include_str!("commit.lua");

/// The commit script; Redis caches it by its SHA-1 (`EVALSHA`).
fn commit_script() -> &'static Script {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    SCRIPT.get_or_init(|| Script::new(COMMIT_LUA))
}

/// The sink. One instance per loaded plugin.
#[derive(Default)]
pub struct RedisSink {
    /// Set by `open`.
    settings: Option<(Settings, Layout)>,
    /// The connection; `None` until the first call that needs it and after
    /// a network failure, so the next call connects again.
    link: Option<Link>,
    /// Rendered changes not yet committed, per table name.
    staged: HashMap<String, Staged>,
}

impl std::fmt::Debug for RedisSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSink")
            .field("settings", &self.settings.as_ref().map(|(s, _)| s))
            .field("connected", &self.link.is_some())
            .field("staged_tables", &self.staged.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Sink for RedisSink {
    fn open(&mut self, _pipeline: &str, config: &Config) -> Result<()> {
        let settings = Settings::parse(config)?;
        let layout = Layout::new(&settings.prefix);
        // Connect now so that a wrong password or database stops the
        // pipeline before any batch; a server that is not up yet is only
        // worth a warning: every call connects again until it answers.
        match connect_and_load(&settings) {
            Ok(link) => self.link = Some(link),
            Err(SinkError::Retryable(why)) => {
                log::warn(format!("{why}; connecting again on the next call"))
            }
            Err(e) => return Err(e),
        }
        self.settings = Some((settings, layout));
        Ok(())
    }

    fn write(&mut self, batch: Batch) -> Result<()> {
        let (settings, layout) = opened(&self.settings)?;
        let changes = changes::prepare(&batch, layout)?;
        let brings_changes = !changes.is_empty();
        let staged = self.staged.entry(batch.table.name.clone()).or_default();
        staged.add(changes, settings.max_commit_bytes, || {
            format!("batch {} of table {}", batch.id, batch.table.name)
        })?;
        if brings_changes {
            staged.starts_at(&batch.low);
        }
        Ok(())
    }

    fn commit(&mut self, request: CommitRequest) -> Result<()> {
        let (settings, layout) = opened(&self.settings)?;
        let table = request.table.as_str();
        let address = &settings.address;
        let control = layout.position_key(&request.pipeline, table);
        let no_changes = Staged::default();
        let staged = self.staged.get(table).unwrap_or(&no_changes);
        let changes = staged.changes();
        let packed = commit_command(&control, &request, staged.low(), changes).get_packed_command();
        match with_link(&mut self.link, settings, |link| {
            run_commit(link, address, &packed)
        })? {
            Reply::Applied => log::debug(format!(
                "{table}: committed {} changes at position {}",
                changes.len(),
                hex::encode(&request.high)
            )),
            Reply::Replayed { stored } => log::info(format!(
                "{table}: position {} was committed already (stored: {stored}); nothing \
                 applied again",
                hex::encode(&request.high)
            )),
            Reply::Inside { stored, low } => {
                return Err(SinkError::Fatal(format!(
                    "table {table}: pipeline {} stands at position {stored} in Redis at \
                     {address}, inside the staged changes (from {low}): another host committed \
                     part of them after this one read where the table stood; restart the \
                     pipeline to recover from Redis",
                    request.pipeline
                )));
            }
            Reply::Fenced { stored_epoch } => {
                return Err(SinkError::Fenced(format!(
                    "table {table}: pipeline {} already committed with epoch {stored_epoch} in \
                     Redis at {address}; this host has epoch {}",
                    request.pipeline, request.epoch
                )));
            }
            Reply::WrongType { key, found } => {
                let ours = if key.as_bytes() == control.as_slice() {
                    "position hash"
                } else {
                    "hash or stream"
                };
                return Err(SinkError::Poison(format!(
                    "table {table}: Redis key {key:?} holds a {found}, where the sink keeps a \
                     {ours}; nothing of this commit was written"
                )));
            }
            Reply::Corrupt { key } => {
                return Err(SinkError::Fatal(format!(
                    "table {table}: the position hash {key:?} in Redis at {address} does not \
                     hold a decimal `epoch` and a hex `position`"
                )));
            }
        }
        if settings.wait_aof {
            with_link(&mut self.link, settings, |link| {
                wait_for_aof(link, settings)
            })?;
        }
        self.staged.remove(table);
        Ok(())
    }

    fn abort(&mut self, table: &str) {
        self.staged.remove(table);
    }
}

impl Positions for RedisSink {
    fn committed(&mut self, pipeline: &str, table: &str) -> Result<Option<Committed>> {
        let (settings, layout) = opened(&self.settings)?;
        let control = layout.position_key(pipeline, table);
        let read = with_link(&mut self.link, settings, |link| {
            link::run::<(Option<Vec<u8>>, Option<Vec<u8>>)>(
                link,
                &settings.address,
                "HMGET of the position",
                redis::cmd("HMGET")
                    .arg(&control)
                    .arg("epoch")
                    .arg("position"),
            )
        });
        let corrupt = |why: &str| {
            SinkError::Fatal(format!(
                "table {table}: the position hash {:?} in Redis at {}: {why}",
                String::from_utf8_lossy(&control),
                settings.address
            ))
        };
        let (epoch, position) = match read? {
            (None, None) => return Ok(None),
            (Some(epoch), Some(position)) => (epoch, position),
            _ => return Err(corrupt("it has only one of `epoch` and `position`")),
        };
        let epoch = std::str::from_utf8(&epoch)
            .ok()
            .filter(|e| !e.starts_with('+'))
            .and_then(|e| e.parse::<u64>().ok())
            .ok_or_else(|| corrupt("`epoch` is not a decimal number"))?;
        let position = std::str::from_utf8(&position)
            .ok()
            .filter(|p| p.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
            .and_then(|p| hex::decode(p).ok())
            .ok_or_else(|| corrupt("`position` is not lowercase hex"))?;
        Ok(Some(Committed { position, epoch }))
    }
}

fn opened(settings: &Option<(Settings, Layout)>) -> Result<(&Settings, &Layout)> {
    settings
        .as_ref()
        .map(|(s, l)| (s, l))
        .ok_or_else(|| SinkError::Fatal("the host called the Redis sink before `open`".into()))
}

/// Runs `call` on the connection, connecting first (and loading the
/// script) if there is none, and forgetting the connection when `call`
/// left it out of step with the server, so the next call connects again.
fn with_link<T>(
    slot: &mut Option<Link>,
    settings: &Settings,
    call: impl FnOnce(&mut Link) -> Result<T>,
) -> Result<T> {
    let link = match slot {
        Some(link) => link,
        None => slot.insert(connect_and_load(settings)?),
    };
    let result = call(link);
    if !link.is_open() {
        *slot = None;
    }
    result
}

/// A new connection with the commit script loaded, so the first commit
/// does not send its changes twice (once refused with NOSCRIPT).
fn connect_and_load(settings: &Settings) -> Result<Link> {
    let mut link = Link::open(settings)?;
    load_script(&mut link, &settings.address)?;
    Ok(link)
}

fn load_script(link: &mut Link, address: &str) -> Result<()> {
    link::run::<String>(
        link,
        address,
        "SCRIPT LOAD",
        redis::cmd("SCRIPT").arg("LOAD").arg(COMMIT_LUA),
    )
    .map(drop)
}

/// `EVALSHA` of the commit script for one table's commit.
fn commit_command(
    control: &[u8],
    request: &CommitRequest,
    low: Option<&[u8]>,
    changes: &[Change],
) -> redis::Cmd {
    // KEYS[1] is the position hash; each data key gets the next index once.
    let mut key_index: HashMap<&[u8], usize> = HashMap::new();
    let mut keys: Vec<&[u8]> = vec![control];
    for change in changes {
        key_index.entry(change.key()).or_insert_with(|| {
            keys.push(change.key());
            keys.len()
        });
    }
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(commit_script().get_hash()).arg(keys.len());
    for key in &keys {
        cmd.arg(*key);
    }
    cmd.arg(request.epoch.to_string())
        .arg(hex::encode(&request.high))
        .arg(low.map(hex::encode).unwrap_or_default())
        .arg(changes.len());
    for change in changes {
        let kind = match change {
            Change::Hash { .. } => "hash",
            Change::Delete { .. } => "del",
            Change::Entry { .. } => "xadd",
        };
        cmd.arg(kind)
            .arg(key_index[change.key()])
            .arg(change.fields().len());
        for (field, value) in change.fields() {
            cmd.arg(field.as_slice()).arg(value.as_slice());
        }
    }
    cmd
}

/// What the commit script answered.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Reply {
    /// The changes and the position are written.
    Applied,
    /// The position was committed before; nothing was written.
    Replayed { stored: String },
    /// A newer epoch committed this table.
    Fenced { stored_epoch: String },
    /// The stored position lies inside the staged changes; nothing was
    /// written.
    Inside { stored: String, low: String },
    /// A key holds a type the sink does not write there; nothing was written.
    WrongType { key: String, found: String },
    /// The position hash does not hold what the sink writes.
    Corrupt { key: String },
}

/// Sends the packed `EVALSHA`; loads the script again if Redis forgot it
/// (a restart, `SCRIPT FLUSH`).
fn run_commit(link: &mut Link, address: &str, packed: &[u8]) -> Result<Reply> {
    use redis::ConnectionLike;
    let mut reply = link
        .req_packed_command(packed)
        .and_then(Value::extract_error);
    if let Err(e) = &reply
        && e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
    {
        load_script(link, address)?;
        reply = link
            .req_packed_command(packed)
            .and_then(Value::extract_error);
    }
    let reply = reply.map_err(|e| link::to_sink_error(address, "the commit script", &e))?;
    let unexpected = || {
        SinkError::Fatal(format!(
            "Redis at {address} answered the commit script with {reply:?}"
        ))
    };
    let Value::Array(items) = &reply else {
        return Err(unexpected());
    };
    let words: Vec<String> = items
        .iter()
        .map(|item| match item {
            Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
            _ => None,
        })
        .collect::<Option<_>>()
        .ok_or_else(unexpected)?;
    let word = |i: usize| words.get(i).cloned().ok_or_else(unexpected);
    Ok(match word(0)?.as_str() {
        "applied" => Reply::Applied,
        "replayed" => Reply::Replayed { stored: word(1)? },
        "inside" => Reply::Inside {
            stored: word(1)?,
            low: word(2)?,
        },
        "fenced" => Reply::Fenced {
            stored_epoch: word(1)?,
        },
        "wrongtype" => Reply::WrongType {
            key: word(1)?,
            found: word(2)?,
        },
        "corrupt" => Reply::Corrupt { key: word(1)? },
        _ => return Err(unexpected()),
    })
}

/// `WAITAOF 1 0`: returns once the local AOF holds the commit on disk.
fn wait_for_aof(link: &mut Link, settings: &Settings) -> Result<()> {
    let address = &settings.address;
    let counts: Vec<i64> = link::run(
        link,
        address,
        "WAITAOF",
        redis::cmd("WAITAOF")
            .arg(1)
            .arg(0)
            .arg(link::duration_ms(settings)),
    )?;
    if counts.first().copied().unwrap_or(0) < 1 {
        return Err(SinkError::Retryable(format!(
            "Redis at {address} did not fsync the commit to its AOF within {} ms",
            link::duration_ms(settings)
        )));
    }
    Ok(())
}

weir_sdk::export_positioned_sink!(RedisSink);
