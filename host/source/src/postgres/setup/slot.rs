//! The replication slot and the publication: checking and creating them,
//! where the slot and the WAL stand, and the replication session's
//! settings.

use pgwire_replication::{Lsn, ReplicationClient, ReplicationConfig};

use crate::SourceError;
use crate::postgres::catalog::{self, SlotInfo, format_lsn};
use crate::postgres::config::PostgresConfig;
use crate::postgres::decode::ident;
use crate::postgres::session::{Session, session_options, unavailable};
use crate::postgres::{Context, Emitted};

/// The replication session's settings, confirming `acked` at the start.
pub(in crate::postgres) fn replication_config(
    dsn: &tokio_postgres::Config,
    config: &PostgresConfig,
    acked: u64,
) -> ReplicationConfig {
    let host = match dsn.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => "localhost".to_string(),
    };
    let port = dsn.get_ports().first().copied().unwrap_or(5432);
    let user = dsn
        .get_user()
        .map(str::to_string)
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_default();
    let password = dsn
        .get_password()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .unwrap_or_default();
    let dbname = dsn
        .get_dbname()
        .map(str::to_string)
        .unwrap_or_else(|| user.clone());
    ReplicationConfig::new(
        host,
        user,
        password,
        dbname,
        config.slot.clone(),
        config.publication.clone(),
    )
    .with_port(port)
    .with_start_lsn(Lsn::ZERO)
    .with_ack_lsn(Lsn::from_u64(acked))
    .with_status_interval(config.status_interval())
    .with_wakeup_interval(config.status_interval())
    .with_options(session_options())
    .with_application_name("weir")
}

/// The replication slot (if it exists) and whether the publication does.
pub(super) fn slot_and_publication(
    session: &mut Session,
    config: &PostgresConfig,
) -> Result<(Option<SlotInfo>, bool), SourceError> {
    session.query("checking the slot", |c| {
        let s = config.slot.clone();
        let p = config.publication.clone();
        Box::pin(async move {
            Ok((
                catalog::slot(c, &s).await?,
                catalog::publication_exists(c, &p).await?,
            ))
        })
    })
}

/// Fails when the slot or the publication this pipeline already started
/// from is gone: weir never backfills again silently.
pub(in crate::postgres) fn check_slot_and_publication(
    session: &mut Session,
    config: &PostgresConfig,
    emitted: &Emitted,
) -> Result<(), SourceError> {
    let (slot, publication_exists) = slot_and_publication(session, config)?;
    match gone_error(config, slot.is_some(), publication_exists, emitted) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

pub(super) fn gone_error(
    config: &PostgresConfig,
    slot_exists: bool,
    publication_exists: bool,
    emitted: &Emitted,
) -> Option<SourceError> {
    let (slot, publication) = (&config.slot, &config.publication);
    let position = emitted.last().cloned().unwrap_or_default();
    if !slot_exists {
        return Some(SourceError::Resume {
            position,
            reason: format!(
                "replication slot `{slot}` no longer exists, but this pipeline has already \
                 started from it: the changes it held are gone, and weir will not silently \
                 backfill again. To start over, delete the sinks' data and the state directory \
                 (or use a new pipeline id) and run again; weir then creates the slot and backfills"
            ),
        });
    }
    if !publication_exists {
        return Some(SourceError::Resume {
            position,
            reason: format!(
                "publication `{publication}` no longer exists, but this pipeline has already \
                 started from it. Re-create it with the same tables \
                 (CREATE PUBLICATION {publication} FOR TABLE ...) and run again"
            ),
        });
    }
    None
}

/// The slot's confirmed position, if the slot exists.
pub(in crate::postgres) fn confirmed_flush(cx: &mut Context) -> Result<Option<u64>, SourceError> {
    let (slot, _) = slot_and_publication(&mut cx.session, &cx.config)?;
    Ok(slot.and_then(|info| info.confirmed_flush))
}

pub(super) fn create_publication(cx: &mut Context) -> Result<(), SourceError> {
    let publication = &cx.config.publication;
    let tables: Vec<String> = cx
        .tables
        .iter()
        .filter(|t| t.departed.is_none())
        .map(|t| t.info.sql_name())
        .collect();
    let sql = format!(
        "CREATE PUBLICATION {} FOR TABLE {}",
        ident(publication),
        tables.join(", ")
    );
    cx.session.execute("creating the publication", &sql)?;
    tracing::info!(%publication, "publication created");
    Ok(())
}

/// An existing slot must be ours to use: pgoutput, in this database.
pub(super) fn check_slot(
    config: &PostgresConfig,
    dsn: &tokio_postgres::Config,
    info: &SlotInfo,
) -> Result<(), SourceError> {
    let slot = &config.slot;
    if info.plugin.as_deref() != Some("pgoutput") {
        return Err(SourceError::Config(format!(
            "replication slot `{slot}` exists but is not a pgoutput logical slot \
             (plugin {:?}); drop it or name another slot",
            info.plugin
        )));
    }
    if let Some(db) = &info.database
        && let Some(mine) = dsn.get_dbname()
        && db != mine
    {
        return Err(SourceError::Config(format!(
            "replication slot `{slot}` belongs to database `{db}`, not `{mine}`"
        )));
    }
    Ok(())
}

pub(in crate::postgres) fn current_wal_lsn(
    session: &mut Session,
) -> Result<Option<u64>, SourceError> {
    let rows = session.rows(
        "reading the current WAL position",
        "SELECT pg_current_wal_insert_lsn()::text",
    )?;
    Ok(rows
        .first()
        .and_then(|r| r[0].as_deref())
        .and_then(catalog::parse_lsn))
}

/// Creates the slot with an exported snapshot, on a session that stays
/// open until the backfill has imported it. Returns that session, the
/// slot's consistent point and the snapshot's name.
pub(super) fn create_slot(
    cx: &mut Context,
) -> Result<(ReplicationClient, u64, Option<String>), SourceError> {
    let slot = &cx.config.slot;
    let cfg = replication_config(cx.session.dsn(), &cx.config, 0);
    let sql = format!(
        "CREATE_REPLICATION_SLOT {} LOGICAL pgoutput EXPORT_SNAPSHOT",
        ident(slot)
    );
    let (client, rows) = cx
        .reader
        .block_on(async {
            let mut client = ReplicationClient::connect_gated(cfg).await?;
            let rows = client.simple_query(&sql).await?;
            Ok::<_, pgwire_replication::PgWireError>((client, rows))
        })
        .map_err(|e| unavailable("cannot create the replication slot", e))?;
    let text = |i: usize| {
        rows.first()
            .and_then(|r| r.get(i).cloned().flatten())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
    };
    let consistent = text(1).as_deref().and_then(catalog::parse_lsn).unwrap_or(0);
    tracing::info!(slot = %slot, consistent_point = %format_lsn(consistent), "replication slot created");
    Ok((client, consistent, text(2)))
}
