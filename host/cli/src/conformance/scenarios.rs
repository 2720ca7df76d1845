//! The scenarios, each on tables of its own. Each starts a fresh instance,
//! drives the sink as a host would in that situation, and checks what the
//! sink claims (with `positions`) and what the operator's reader shows.

use super::harness::{Harness, Step, Stop, answered, change, delete, inserts};
use weir_runtime::capability::blob_faults::FaultKind;
use weir_runtime::{CallError, SinkError};
use weir_source::commit_order::StreamPosition;

/// A scenario: its id, what it checks, and how.
pub struct Scenario {
    pub name: &'static str,
    pub checks: &'static str,
    pub run: fn(&mut Harness) -> Step<String>,
}

/// Every scenario, in the order they run.
pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "delivery",
        checks: "staged rows stay invisible until commit; inserts, updates and deletes land",
        run: delivery,
    },
    Scenario {
        name: "replay",
        checks: "after a restart, batches it already committed are not shown twice",
        run: replay,
    },
    Scenario {
        name: "crash-after-stage",
        checks: "a crash after `write`, before `commit`, leaves nothing of the batch",
        run: crash_after_stage,
    },
    Scenario {
        name: "crash-after-commit",
        checks: "a crash after the sink's commit, before the host recorded it",
        run: crash_after_commit,
    },
    Scenario {
        name: "abort-retry",
        checks: "`abort` drops what was staged; the retried batch lands once",
        run: abort_retry,
    },
    Scenario {
        name: "delete-missing-key",
        checks: "deleting a key the destination never had is success",
        run: delete_missing_key,
    },
    Scenario {
        name: "empty-commit",
        checks: "a commit with nothing staged succeeds and advances the position",
        run: empty_commit,
    },
    Scenario {
        name: "same-batch-twice",
        checks: "the same batch id written twice before a commit lands once",
        run: same_batch_twice,
    },
    Scenario {
        name: "older-epoch",
        checks: "a commit from an older epoch is refused with `fenced`",
        run: older_epoch,
    },
    Scenario {
        name: "commit-inside-staged",
        checks: "a commit whose staged changes another host committed in part meanwhile is refused",
        run: commit_inside_staged,
    },
    Scenario {
        name: "new-nullable-column",
        checks: "a batch with a new nullable column lands, or is refused as poison",
        run: new_nullable_column,
    },
    Scenario {
        name: "retryable",
        checks: "a store failure mid-commit is answered `retryable`; the retry lands once",
        run: retryable,
    },
    Scenario {
        name: "trap-mid-commit",
        checks: "a crash at each blob write of a commit recovers to exactly the committed rows",
        run: trap_mid_commit,
    },
];

fn delivery(h: &mut Harness) -> Step<String> {
    h.start()?;
    let mut t = h.table("delivery");
    let first = h.batch(&t, inserts(1..=20));
    h.must_write(&mut t, &first)?;
    // Nothing is committed yet, so the reader must show nothing.
    h.verify(
        &t,
        "after `write`, before `commit` (staged rows must not be visible before commit)",
    )?;
    h.must_commit(&mut t, &first.header.high)?;
    h.verify(&t, "after the first commit")?;
    h.check_claim(&t, "after the first commit")?;

    let mut rows: Vec<_> = (1..=5)
        .map(|id| {
            change(
                "update",
                id,
                Some(&format!("row {id} v2")),
                Some(id * 100 + 1),
            )
        })
        .collect();
    rows.extend((6..=8).map(delete));
    rows.extend(inserts(21..=25));
    let second = h.batch(&t, rows);
    h.deliver(&mut t, &second)?;
    h.verify(&t, "after a commit of updates, deletes and inserts")?;
    h.check_claim(&t, "after the second commit")?;
    Ok("2 commits: 20 inserts, then 5 updates, 3 deletes and 5 inserts".into())
}

fn replay(h: &mut Harness) -> Step<String> {
    h.start()?;
    let mut t = h.table("replay");
    let batch = h.batch(&t, inserts(1..=10));
    h.deliver(&mut t, &batch)?;
    h.start()?;
    if h.positioned {
        h.check_claim(&t, "after a restart")?;
        h.verify(&t, "after a restart")?;
        return Ok("after a restart it named its own position; nothing to replay".into());
    }
    // The host's records say the batch is done, but a host that lost them
    // (or committed other sinks first) sends it again, same id.
    h.deliver(&mut t, &batch)?;
    h.verify(
        &t,
        "after the committed batch was replayed with the same id",
    )?;
    Ok("a committed batch replayed with the same id shows once".into())
}

fn crash_after_stage(h: &mut Harness) -> Step<String> {
    h.start()?;
    let mut t = h.table("crash_after_stage");
    let first = h.batch(&t, inserts(1..=10));
    h.deliver(&mut t, &first)?;
    let second = h.batch(&t, inserts(11..=20));
    h.must_write(&mut t, &second)?;
    h.crash();
    h.forget_staged(&mut t);
    h.start()?;
    h.check_claim(&t, "after a crash between `write` and `commit`")?;
    h.verify(&t, "after a crash between `write` and `commit`")?;
    h.deliver(&mut t, &second)?;
    h.verify(&t, "after the lost batch was sent again")?;
    h.check_claim(&t, "after the lost batch was sent again")?;
    Ok("the staged batch vanished with the instance; resent, it landed once".into())
}

fn crash_after_commit(h: &mut Harness) -> Step<String> {
    h.start()?;
    let mut t = h.table("crash_after_commit");
    let first = h.batch(&t, inserts(1..=10));
    h.deliver(&mut t, &first)?;
    let host_record = t.acknowledged.clone();
    let second = h.batch(&t, inserts(11..=20));
    h.deliver(&mut t, &second)?;
    // The sink committed; the host dies before writing it down.
    h.crash();
    h.start()?;
    if h.positioned {
        h.check_claim(&t, "after a crash between its commit and the host's record")?;
        h.verify(&t, "after a crash between its commit and the host's record")?;
        return Ok("it named the commit the host had not recorded; nothing replayed".into());
    }
    // The host resumes from its own record, one commit behind.
    t.acknowledged = host_record;
    h.deliver(&mut t, &second)?;
    h.verify(&t, "after the host replayed the commit it had not recorded")?;
    Ok("the replayed commit shows once".into())
}

fn abort_retry(h: &mut Harness) -> Step<String> {
    h.start()?;
    let mut t = h.table("abort_retry");
    let first = h.batch(&t, inserts(1..=10));
    let low = first.header.low.as_stream().map_or(1, |(n, _)| n);
    // What was staged and then aborted: other rows over the same start, as
    // a host retrying after a failure sends the range again.
    let dropped = h.batch_at(&t, low, low + 3, inserts(101..=104));
    h.must_write(&mut t, &dropped)?;
    h.abort(&mut t);
    h.deliver(&mut t, &first)?;
    h.verify(&t, "after `abort` and a commit of the retried batch")?;
    h.check_claim(&t, "after `abort` and a commit of the retried batch")?;
    Ok("the aborted rows never showed; the retried batch landed once".into())
}

fn delete_missing_key(h: &mut Harness) -> Step<String> {
    h.start()?;
    let mut t = h.table("delete_missing_key");
    let mut rows = inserts(1..=2);
    rows.push(delete(999));
    let batch = h.batch(&t, rows);
    h.must_write(&mut t, &batch)?;
    h.commit(&mut t, &batch.header.high).map_err(|e| {
        Stop::Fail(format!(
            "a commit with a delete of a key the destination never had answered: {e}"
        ))
    })?;
    h.verify(&t, "after deleting a key that was never there")?;
    Ok("the delete of id 999 succeeded".into())
}

fn empty_commit(h: &mut Harness) -> Step<String> {
    h.start()?;
    let mut t = h.table("empty_commit");
    let batch = h.batch(&t, inserts(1..=5));
    h.deliver(&mut t, &batch)?;
    let later = h.advance();
    h.commit(&mut t, &later)
        .map_err(|e| Stop::Fail(format!("a commit with nothing staged answered: {e}")))?;
    h.check_claim(&t, "after a commit with nothing staged")?;
    h.start()?;
    h.check_claim(&t, "after a commit with nothing staged and a restart")?;
    h.verify(&t, "after a commit with nothing staged")?;
    Ok(match h.positioned {
        true => "the empty commit moved its position; it held over a restart".into(),
        false => "the empty commit succeeded and changed nothing".into(),
    })
}

fn same_batch_twice(h: &mut Harness) -> Step<String> {
    h.start()?;
    let mut t = h.table("same_batch_twice");
    let batch = h.batch(&t, inserts(1..=10));
    h.must_write(&mut t, &batch)?;
    // A write whose answer was lost (a retry after `retryable`) comes again.
    h.must_write(&mut t, &batch)?;
    h.must_commit(&mut t, &batch.header.high)?;
    h.verify(&t, "after the same batch was written twice and committed")?;
    Ok("written twice, shown once".into())
}

fn older_epoch(h: &mut Harness) -> Step<String> {
    if !h.positioned {
        return Err(Stop::NotApplicable(
            "no `positions`: the host fences such sinks itself".into(),
        ));
    }
    h.start()?;
    h.start()?;
    let mut t = h.table("older_epoch");
    let first = h.batch(&t, inserts(1..=5));
    h.deliver(&mut t, &first)?;
    let current = h.epoch;
    let zombie = h.batch(&t, inserts(6..=10));
    h.must_write(&mut t, &zombie)?;
    let acknowledged = t.acknowledged.clone();
    let answer = h.commit_at_epoch(&mut t, &zombie.header.high, current - 1);
    match answer {
        Err(CallError::Sink(SinkError::Fenced(_))) => {}
        Ok(()) => {
            return Err(Stop::Fail(format!(
                "a commit at epoch {} after one at epoch {current} was accepted (a zombie host \
                 would overwrite a newer one)",
                current - 1
            )));
        }
        other => {
            return Err(Stop::Fail(format!(
                "a commit from an older epoch answered {}, not `fenced`",
                answered(&other)
            )));
        }
    }
    h.abort(&mut t);
    t.acknowledged = acknowledged;
    h.check_claim(&t, "after refusing an older epoch")?;
    h.verify(&t, "after refusing an older epoch")?;
    Ok(format!(
        "epoch {} refused after epoch {current}",
        current - 1
    ))
}

/// A host stalls mid-commit while the pipeline moves; the new owner reads
/// where the table stands and stages the changes after it; then the stalled
/// commit lands (no newer epoch has committed, so fencing lets it through)
/// with part of those changes. The new owner's commit must be refused: it
/// would hold those changes twice (an append table would show them twice,
/// a counter would count them twice). The run then restarts and resumes
/// from the table.
fn commit_inside_staged(h: &mut Harness) -> Step<String> {
    /// Retries of a `retryable` answer to the new owner's commit.
    const RETRIES: usize = 3;
    if !h.positioned {
        return Err(Stop::NotApplicable(
            "no `positions`: the host records what each commit holds and replays by batch id"
                .into(),
        ));
    }
    h.start()?;
    let old_epoch = h.epoch;
    let mut t = h.table("commit_inside_staged");
    let first = h.batch(&t, inserts(1..=5));
    h.deliver(&mut t, &first)?;
    // The old owner's next batch, staged when it stalls (its positions are
    // handed out again below, to the new owner's batch).
    let from = h.last_position() + 1;
    let stalled = h.batch_at(&t, from, from + 3, inserts(6..=9));
    let old_owner = h.set_aside();
    h.write_aside(&old_owner, &stalled).map_err(|e| {
        Stop::Fail(format!(
            "the old owner's `write` of {} rows answered: {e}",
            stalled.rows.len()
        ))
    })?;
    // The new owner reads the table where the first commit left it, and
    // stages everything after it.
    h.start()?;
    h.check_claim(&t, "when the new owner starts")?;
    let staged = h.batch(&t, inserts(6..=15));
    h.must_write(&mut t, &staged)?;
    // The stalled commit lands.
    match h.commit_aside(&old_owner, &t, &stalled.header.high, old_epoch) {
        Ok(()) => h.record_landed(&mut t, &stalled, old_epoch),
        Err(CallError::Sink(SinkError::Fenced(_))) => {
            // Refused already (the sink fences epochs that only started):
            // nothing landed inside the new owner's changes, and its
            // commit must go through.
            drop(old_owner);
            h.must_commit(&mut t, &staged.header.high)?;
            h.check_claim(&t, "after the new owner's commit")?;
            h.verify(&t, "after the new owner's commit")?;
            return Ok(format!(
                "the stalled commit (epoch {old_epoch}) was fenced once epoch {} started",
                h.epoch
            ));
        }
        Err(e) => {
            return Err(Stop::Fail(format!(
                "the stalled commit at epoch {old_epoch}, with no newer commit made yet, \
                 answered: {e}"
            )));
        }
    }
    drop(old_owner);
    let acknowledged = t.acknowledged.clone();
    // `retryable` (a sink that finds another writer's commit where it meant
    // to put its own) is retried, as the host retries it.
    let mut answer = h.commit(&mut t, &staged.header.high);
    for _ in 0..RETRIES {
        if !matches!(answer, Err(CallError::Sink(SinkError::Retryable(_)))) {
            break;
        }
        answer = h.commit(&mut t, &staged.header.high);
    }
    if answer.is_ok() {
        return Err(Stop::Fail(format!(
            "a commit at {} (epoch {}) whose staged changes start at {} was accepted after \
             another host's commit reached {} inside them: those changes are held twice",
            staged.header.high, h.epoch, staged.header.low, stalled.header.high
        )));
    }
    let refusal = answered(&answer);
    // The refusal fails the run, which restarts and resumes from where the
    // table stands: the stalled commit's position, with nothing of the
    // refused commit visible.
    t.acknowledged = acknowledged;
    h.start()?;
    h.forget_staged(&mut t);
    let when = "after refusing a commit over another host's, and a restart";
    h.check_claim(&t, when)?;
    h.verify(&t, when)?;
    let rest = h.batch_at(&t, from + 4, from + 9, inserts(10..=15));
    h.deliver(&mut t, &rest)?;
    h.check_claim(&t, "after resuming from the table")?;
    h.verify(&t, "after resuming from the table")?;
    Ok(format!(
        "refused ({refusal}); resumed from the stalled commit's position"
    ))
}

fn new_nullable_column(h: &mut Harness) -> Step<String> {
    h.start()?;
    let mut t = h.table("new_nullable_column");
    let first = h.batch(&t, inserts(1..=5));
    h.deliver(&mut t, &first)?;
    let mut rows = inserts(6..=9);
    for (i, row) in rows.iter_mut().enumerate() {
        // Some set, some null: the new column is nullable.
        row.note = (i % 2 == 0).then(|| format!("note {}", row.id));
    }
    let second = h.batch(&t, rows);
    let answer = h
        .write(&mut t, &second)
        .and_then(|()| h.commit(&mut t, &second.header.high));
    match answer {
        Ok(()) => {}
        Err(CallError::Sink(SinkError::Poison(why))) => {
            h.abort(&mut t);
            return Err(Stop::Refused(format!("refused as poison: {why}")));
        }
        Err(e) => {
            return Err(Stop::Fail(format!(
                "a batch with a new nullable column `note` was answered: {e}"
            )));
        }
    }
    h.verify(&t, "after a batch with a new nullable column `note`")?;
    h.check_claim(&t, "after a batch with a new nullable column")?;
    Ok("the new column `note` landed, null where it was null".into())
}

fn retryable(h: &mut Harness) -> Step<String> {
    h.start()?;
    let mut t = h.table("retryable");
    let first = h.batch(&t, inserts(1..=5));
    h.deliver(&mut t, &first)?;
    let second = h.batch(&t, inserts(6..=10));
    h.must_write(&mut t, &second)?;
    h.arm(FaultKind::TransientIo, 1);
    let answer = h.commit(&mut t, &second.header.high);
    let (fired, _) = h.faults.disarm();
    if !fired {
        answer.map_err(|e| Stop::Fail(format!("`commit` answered: {e}")))?;
        return Err(Stop::NotApplicable(
            "its commit made no blob write, so no store failure could be injected".into(),
        ));
    }
    let detail = match answer {
        Err(CallError::Sink(SinkError::Retryable(_))) => {
            h.must_commit(&mut t, &second.header.high)?;
            "answered `retryable`; the retried commit landed once"
        }
        Ok(()) => "retried the failed write itself and answered ok",
        other => {
            return Err(Stop::Fail(format!(
                "a transient store failure during `commit` was answered {}, not `retryable`",
                answered(&other)
            )));
        }
    };
    h.verify(&t, "after a store failure during `commit` and the retry")?;
    h.check_claim(&t, "after a store failure during `commit` and the retry")?;
    Ok(detail.into())
}

/// The most blob writes of one commit the scenario crashes at.
const MAX_CRASH_POINTS: u64 = 24;

fn trap_mid_commit(h: &mut Harness) -> Step<String> {
    for at in 1..=MAX_CRASH_POINTS {
        h.start()?;
        let mut t = h.table(&format!("trap_mid_commit_{at}"));
        let first = h.batch(&t, inserts(1..=10));
        h.deliver(&mut t, &first)?;
        let host_record = t.acknowledged.clone();
        let mut rows: Vec<_> = (1..=3)
            .map(|id| change("update", id, Some("changed"), Some(-id)))
            .collect();
        rows.extend((4..=5).map(delete));
        rows.extend(inserts(11..=15));
        let second = h.batch(&t, rows);
        h.must_write(&mut t, &second)?;
        h.arm(FaultKind::Crash, at);
        let answer = h.commit(&mut t, &second.header.high);
        let (fired, writes) = h.faults.disarm();
        if !fired {
            answer.map_err(|e| Stop::Fail(format!("`commit` answered: {e}")))?;
            h.verify(&t, "after a commit no crash reached")?;
            return match at {
                1 => Err(Stop::NotApplicable(
                    "its commit made no blob write to crash at".into(),
                )),
                _ => Ok(format!(
                    "crashed at each of its commit's {} blob writes; every restart recovered exactly",
                    writes
                )),
            };
        }
        if answer.is_ok() {
            return Err(Stop::Fail(format!(
                "`commit` answered ok although the instance died at blob write {at}"
            )));
        }
        h.crash();
        h.start()?;
        let when = format!("after a crash at blob write {at} of a commit");
        if h.positioned {
            // Atomic: it stands at the old commit or the new one, and the
            // reader shows exactly that commit's rows.
            let claim = h.claim(&t)?;
            let landed = claim
                .as_ref()
                .is_some_and(|c| c.position == second.header.high && c.epoch == h.epoch - 1);
            if landed {
                // The commit landed although its answer was lost.
                h.forget_staged(&mut t);
                h.record_landed(&mut t, &second, h.epoch - 1);
                h.verify(&t, &when)?;
                continue;
            }
            t.acknowledged = host_record;
            h.forget_staged(&mut t);
            h.check_claim(&t, &when)?;
            h.verify(&t, &when)?;
            h.deliver(&mut t, &second)?;
        } else {
            h.forget_staged(&mut t);
            t.acknowledged = host_record;
            h.deliver(&mut t, &second)?;
        }
        h.verify(&t, &format!("{when} and the replay"))?;
    }
    Ok(format!(
        "crashed at each of the first {MAX_CRASH_POINTS} blob writes of a commit; every restart recovered exactly"
    ))
}
