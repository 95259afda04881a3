//! Running an action's command: no shell, stdin closed, killed at its time limit, output
//! kept bounded (the tail, where a log's newest lines are).

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ran {
    /// It exited; `success` is exit status 0.
    Exited {
        /// Exit status 0.
        success: bool,
        /// `exit status N` or `signal N`.
        status: String,
        /// The kept tail of stdout.
        stdout: String,
        /// The kept tail of stderr.
        stderr: String,
        /// Whether stdout was cut.
        truncated: bool,
    },
    /// Killed at its time limit.
    TimedOut,
    /// Could not be started.
    NotStarted(String),
}

/// Keeps the last `keep` bytes read from `r`, and whether anything was dropped.
async fn read_tail<R: AsyncRead + Unpin>(mut r: R, keep: usize) -> (Vec<u8>, bool) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let mut dropped = false;
    loop {
        match r.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                // Drain in big steps so a long output costs O(n), not O(n²).
                if buf.len() > keep.saturating_mul(2).max(16 * 1024) {
                    let cut = buf.len() - keep;
                    buf.drain(..cut);
                    dropped = true;
                }
            }
        }
    }
    if buf.len() > keep {
        let cut = buf.len() - keep;
        buf.drain(..cut);
        dropped = true;
    }
    (buf, dropped)
}

/// Runs `argv` under `timeout`, keeping at most `keep` bytes of stdout (its end) and 4 KiB
/// of stderr.
pub async fn run(argv: &[String], timeout: Duration, keep: usize) -> Ran {
    let Some((program, args)) = argv.split_first() else {
        return Ran::NotStarted("empty command".into());
    };
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return Ran::NotStarted(format!("cannot run {program}: {e}")),
    };
    let out = child.stdout.take();
    let err = child.stderr.take();
    let work = async {
        let (o, e) = tokio::join!(
            async {
                match out {
                    Some(o) => read_tail(o, keep).await,
                    None => (Vec::new(), false),
                }
            },
            async {
                match err {
                    Some(e) => read_tail(e, 4096).await,
                    None => (Vec::new(), false),
                }
            }
        );
        (child.wait().await, o, e)
    };
    match tokio::time::timeout(timeout, work).await {
        Err(_) => Ran::TimedOut,
        Ok((Err(e), _, _)) => Ran::NotStarted(format!("cannot wait for {program}: {e}")),
        Ok((Ok(st), (o, truncated), (e, _))) => Ran::Exited {
            success: st.success(),
            status: st.to_string(),
            stdout: String::from_utf8_lossy(&o).into_owned(),
            stderr: String::from_utf8_lossy(&e).into_owned(),
            truncated,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Vec<String> {
        vec!["sh".into(), "-c".into(), script.into()]
    }

    #[tokio::test]
    async fn output_tail_status_and_timeout() {
        match run(
            &sh("seq 1 100000; echo oops >&2; exit 3"),
            Duration::from_secs(20),
            100,
        )
        .await
        {
            Ran::Exited {
                success,
                status,
                stdout,
                stderr,
                truncated,
            } => {
                assert!(!success);
                assert!(status.contains('3'), "{status}");
                assert!(
                    stdout.len() <= 100 && stdout.ends_with("100000\n"),
                    "{stdout}"
                );
                assert!(truncated);
                assert_eq!(stderr, "oops\n");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            run(&sh("sleep 5"), Duration::from_millis(200), 100).await,
            Ran::TimedOut
        );
        assert!(matches!(
            run(&["/nonexistent/x".to_string()], Duration::from_secs(1), 10).await,
            Ran::NotStarted(_)
        ));
    }
}
