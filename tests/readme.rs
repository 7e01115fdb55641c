//! The README runs as printed. Every fenced block of README.md is checked
//! against the real program, so that the next change the README does not
//! follow fails here instead of in front of a new user:
//!
//! - ```` ```sh ````, ```` ```bash ```` and ```` ```console ```` (`$ ` prompts)
//!   blocks run, top to bottom, in one bash "terminal" whose variables carry
//!   from block to block (as they do for someone pasting them), in a
//!   temporary working directory. The output a command prints is compared
//!   with what the README prints after it (see [`Expected`]).
//! - ```` ```toml ```` blocks load with the real configuration loader
//!   ([`Config::from_toml`]), a fragment without `[[upstream]]` given a dummy
//!   one: an unknown key or an invalid value fails.
//! - the ```` ```nginx ```` block passes `nginx -t` (inside an `http {}`),
//!   or, where nginx is not installed, a syntax check; in CI nginx must be
//!   there.
//! - a ```` ```yaml ```` block is a Kubernetes spec for the configuration
//!   of the ```` ```toml ```` block before it: a proxy started from that
//!   file answers 200 on each probe path, on the port it listens on, and the
//!   timings fit its drain (see [`Probes`]).
//! - the block marked `synopsis` names every flag and subcommand of
//!   `--help`, and nothing `--help` does not know.
//!
//! A block that cannot run here (it needs npm, another Redis, minutes, or is
//! this very test) is marked right before its fence with
//! `<!-- readme-test: skip (why) -->`; skips are listed in the output.
//!
//! How the README's commands meet this test's processes, in one place:
//! - `cargo run --release -- ARGS` and `mcp-resume-proxy ARGS` are the binary
//!   cargo built for this test (no release build is run);
//! - a command that starts the proxy (anything but `streams`, `--help`,
//!   `--version`) starts it in the background, as the user would in a
//!   terminal of its own, stopping the one started before (as the user
//!   would press Ctrl-C), and returns once `/healthz` answers;
//! - the README's fixed addresses are this test's free loopback ports:
//!   `127.0.0.1:8080` (and `localhost:8080`) is the proxy's, and
//!   `127.0.0.1:3001` is a demo upstream this test runs (the "your own MCP
//!   server" of the quick start). A proxy started without `--listen` is
//!   given the proxy's address.
//! - any other `cargo` command is refused: mark its block skip.

mod common;

use std::fmt::Write as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mcp_resume_proxy::config::Config;
use mcp_resume_proxy::demo::upstream::{DemoOptions, DemoUpstream};

const README: &str = include_str!("../README.md");
const BIN: &str = env!("CARGO_BIN_EXE_mcp-resume-proxy");
/// One block's commands, all of them, must end within this.
const BLOCK_LIMIT: Duration = Duration::from_secs(40);

// ---------------------------------------------------------------------------
// The README's blocks

/// One fenced block of README.md.
#[derive(Debug)]
struct Block {
    /// 1-based line of the opening fence.
    fence: usize,
    lang: String,
    /// The lines between the fences.
    lines: Vec<String>,
    mark: Option<Mark>,
}

#[derive(Debug, Clone, PartialEq)]
enum Mark {
    /// `<!-- readme-test: skip (why) -->`
    Skip(String),
    /// `<!-- readme-test: synopsis -->`: the command-line synopsis.
    Synopsis,
}

impl Block {
    /// The README line of `lines[i]`.
    fn line_of(&self, i: usize) -> usize {
        self.fence + 1 + i
    }

    fn is_shell(&self) -> bool {
        matches!(self.lang.as_str(), "sh" | "bash" | "console")
    }

    fn skip(&self) -> Option<&str> {
        match &self.mark {
            Some(Mark::Skip(why)) => Some(why),
            _ => None,
        }
    }
}

fn blocks() -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut previous = ""; // the last non-blank line before a fence
    let mut open: Option<Block> = None;
    for (i, line) in README.lines().enumerate() {
        if let Some(fence) = line.strip_prefix("```") {
            match open.take() {
                Some(block) => {
                    blocks.push(block);
                    // A mark belongs to the fence right after it only.
                    previous = "";
                }
                None => {
                    open = Some(Block {
                        fence: i + 1,
                        lang: fence.trim().to_owned(),
                        lines: Vec::new(),
                        mark: mark(previous, i),
                    })
                }
            }
            continue;
        }
        match &mut open {
            Some(block) => block.lines.push(line.to_owned()),
            None if !line.trim().is_empty() => previous = line,
            None => {}
        }
    }
    assert!(open.is_none(), "README.md ends inside a fenced block");
    blocks
}

/// The `<!-- readme-test: … -->` mark on the line before a fence (`fence`
/// is the fence's 0-based line, for the message).
fn mark(line: &str, fence: usize) -> Option<Mark> {
    let inner = line
        .trim()
        .strip_prefix("<!-- readme-test:")?
        .strip_suffix("-->")?
        .trim();
    if inner == "synopsis" {
        return Some(Mark::Synopsis);
    }
    let why = inner
        .strip_prefix("skip")
        .map(str::trim)
        .and_then(|w| w.strip_prefix('('))
        .and_then(|w| w.strip_suffix(')'))
        .filter(|w| !w.trim().is_empty());
    match why {
        Some(why) => Some(Mark::Skip(why.trim().to_owned())),
        None => panic!(
            "the mark before README.md:{}: {inner:?} is neither `skip (why)` nor `synopsis`",
            fence + 1
        ),
    }
}

// ---------------------------------------------------------------------------
// Expected output

/// What the README prints after a command, as comment lines (`# …`).
///
/// Only lines that look like output are compared: a line starting with `{`,
/// `data:`, `HTTP/` or a lower-case header (`mcp-session-id: …`), each
/// optionally after `… `, together with the comment lines below it that are
/// indented deeper (its continuation). Other comment lines are prose. Each
/// such item must match one line the command printed, in order, where
///
/// - `…` stands for anything, and so does a word glued to it (`AhzYne6z…`,
///   an example token or id);
/// - a run of spaces (and the breaks between continuation lines) stands
///   for any spacing, none included;
/// - timestamps (`2026-11-23T19:50:28.152Z`), 32-hex ids and 13-digit
///   epoch milliseconds are equal to any other of their kind.
#[derive(Debug, Clone)]
struct Expected {
    /// README line where the item starts.
    line: usize,
    text: String,
}

fn is_item_start(text: &str) -> bool {
    let text = text.strip_prefix("… ").unwrap_or(text);
    if text.starts_with('{') || text.starts_with("data:") || text.starts_with("HTTP/") {
        return true;
    }
    // A header line: `name: value` with a lower-case token for a name.
    match text.split_once(": ") {
        Some((name, _)) => {
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        }
        None => false,
    }
}

/// The compared items among `comments` (README lines `first..`).
fn expected(comments: &[(usize, &str)]) -> Vec<Expected> {
    let mut items: Vec<(usize, Expected)> = Vec::new(); // (indent, item)
    let mut current: Option<usize> = None; // indent of the open item
    for &(line, comment) in comments {
        let body = comment.trim_start().trim_start_matches('#');
        let indent = body.len() - body.trim_start().len();
        let text = body.trim();
        match current {
            Some(open) if indent > open && !text.is_empty() => {
                if let Some((_, item)) = items.last_mut() {
                    item.text.push(' ');
                    item.text.push_str(text);
                }
            }
            _ if is_item_start(text) => {
                current = Some(indent);
                items.push((
                    indent,
                    Expected {
                        line,
                        text: text.to_owned(),
                    },
                ));
            }
            _ => current = None,
        }
    }
    items.into_iter().map(|(_, item)| item).collect()
}

/// Kinds of values that differ from run to run, made equal.
fn normalise(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        if let Some(n) = timestamp_at(&chars[i..]) {
            out.push_str("<time>");
            i += n;
            continue;
        }
        let boundary = i == 0 || !chars[i - 1].is_ascii_alphanumeric();
        if boundary {
            let run = chars[i..]
                .iter()
                .take_while(|c| c.is_ascii_alphanumeric())
                .count();
            let word = &chars[i..i + run];
            if run == 32 && word.iter().all(|c| c.is_ascii_hexdigit()) {
                out.push_str("<id>");
                i += run;
                continue;
            }
            if run == 13 && word.iter().all(char::is_ascii_digit) {
                out.push_str("<ms>");
                i += run;
                continue;
            }
        }
        out.push(chars[i]);
        i += 1;
    }
    out
}

/// `2026-11-23T19:50:28.152Z` (fraction optional) at the start: its length.
fn timestamp_at(c: &[char]) -> Option<usize> {
    let digit = |i: usize| c.get(i).is_some_and(char::is_ascii_digit);
    let is = |i: usize, ch: char| c.get(i) == Some(&ch);
    let shape = [0, 1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18]
        .into_iter()
        .all(digit)
        && is(4, '-')
        && is(7, '-')
        && is(10, 'T')
        && is(13, ':')
        && is(16, ':');
    if !shape {
        return None;
    }
    let mut n = 19;
    if is(n, '.') {
        n += 1;
        while digit(n) {
            n += 1;
        }
    }
    is(n, 'Z').then_some(n + 1)
}

#[derive(Debug, PartialEq)]
enum Piece {
    Text(String),
    Any,
    Space,
}

fn pattern(expected: &str) -> Vec<Piece> {
    let mut pieces: Vec<Piece> = Vec::new();
    let mut text = String::new();
    let flush = |text: &mut String, pieces: &mut Vec<Piece>| {
        if !text.is_empty() {
            pieces.push(Piece::Text(std::mem::take(text)));
        }
    };
    for c in normalise(expected).chars() {
        match c {
            '…' => {
                // A word glued to the ellipsis is an example value: drop it.
                while text.ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
                    text.pop();
                }
                flush(&mut text, &mut pieces);
                pieces.push(Piece::Any);
            }
            c if c.is_whitespace() => {
                flush(&mut text, &mut pieces);
                if pieces.last() != Some(&Piece::Space) {
                    pieces.push(Piece::Space);
                }
            }
            c => text.push(c),
        }
    }
    flush(&mut text, &mut pieces);
    pieces
}

/// Whether all of `line` matches `pieces`.
fn matches(pieces: &[Piece], line: &str) -> bool {
    match pieces.split_first() {
        None => line.is_empty(),
        Some((Piece::Text(t), rest)) => line
            .strip_prefix(t.as_str())
            .is_some_and(|tail| matches(rest, tail)),
        Some((Piece::Space, rest)) => matches(rest, line.trim_start()),
        Some((Piece::Any, rest)) => line
            .char_indices()
            .map(|(i, _)| i)
            .chain([line.len()])
            .any(|i| matches(rest, &line[i..])),
    }
}

/// The first item of `expected` that `output` lacks (items must appear in
/// order, each on a line of its own), or None.
fn compare<'a>(expected: &'a [Expected], output: &str) -> Option<&'a Expected> {
    let lines: Vec<String> = output
        .lines()
        .map(|l| normalise(l.trim_end_matches('\r')))
        .collect();
    let mut next = 0;
    for item in expected {
        let pieces = pattern(&item.text);
        match (next..lines.len()).find(|&i| matches(&pieces, lines[i].trim())) {
            Some(i) => next = i + 1,
            None => return Some(item),
        }
    }
    None
}

// ---------------------------------------------------------------------------
// The shell

/// A command of a shell block and what the README prints after it.
struct Chunk {
    /// README line of its first line.
    line: usize,
    code: String,
    expected: Vec<Expected>,
}

/// A shell block cut into commands: a run of code lines, then the comment
/// lines after it. Comments before the first command are prose.
fn chunks(block: &Block) -> Vec<Chunk> {
    // A console block: `$ ` lines are commands, the lines after them output.
    let lines: Vec<String> = if block.lang == "console" {
        block
            .lines
            .iter()
            .map(|l| match l.strip_prefix("$ ") {
                Some(command) => command.to_owned(),
                None => format!("# {l}"),
            })
            .collect()
    } else {
        block.lines.clone()
    };
    let mut chunks: Vec<Chunk> = Vec::new();
    let mut comments: Vec<(usize, &str)> = Vec::new();
    let mut in_code = false;
    let close = |chunks: &mut Vec<Chunk>, comments: &mut Vec<(usize, &str)>| {
        if let Some(last) = chunks.last_mut() {
            last.expected = expected(comments);
        }
        comments.clear();
    };
    for (i, line) in lines.iter().enumerate() {
        let comment = line.trim_start().starts_with('#');
        if comment || line.trim().is_empty() {
            if !line.trim().is_empty() {
                comments.push((block.line_of(i), line.as_str()));
            }
            in_code = false;
            continue;
        }
        if in_code {
            if let Some(last) = chunks.last_mut() {
                last.code.push('\n');
                last.code.push_str(line);
            }
        } else {
            close(&mut chunks, &mut comments);
            chunks.push(Chunk {
                line: block.line_of(i),
                code: line.clone(),
                expected: Vec::new(),
            });
            in_code = true;
        }
    }
    close(&mut chunks, &mut comments);
    chunks
}

/// The README's fixed addresses, and what this test puts in their place.
fn rewrites(proxy: &str, upstream: &str) -> Vec<(String, String)> {
    vec![
        ("127.0.0.1:8080".into(), proxy.into()),
        ("localhost:8080".into(), proxy.into()),
        ("127.0.0.1:3001".into(), upstream.into()),
    ]
}

fn rewrite(text: &str, rules: &[(String, String)]) -> String {
    rules
        .iter()
        .fold(text.to_owned(), |t, (from, to)| t.replace(from, to))
}

/// Functions every block runs with: the README's commands, bound to this
/// test's binary and addresses.
const PRELUDE: &str = r#"
# The proxy binary, under the names the README uses for it.
cargo() {
    if [ "$1 $2 $3" = "run --release --" ]; then
        shift 3
        __readme_proxy "$@"
    else
        echo "readme test: 'cargo $*' is not run here: mark its block skip" >&2
        return 127
    fi
}
mcp-resume-proxy() { __readme_proxy "$@"; }
__readme_proxy() {
    case "${1:-}" in
        streams|--help|-h|--version|-V|help) "$README_BIN" "$@" ;;
        *) __readme_serve "$@" ;;
    esac
}
# A proxy (or the demo) in the background, as in a terminal of its own; the
# one started before is stopped first, as with Ctrl-C.
__readme_serve() {
    __readme_stop
    local listen=(--listen "$README_PROXY_ADDR") a
    for a in "$@"; do [ "$a" = --listen ] && listen=(); done
    RUST_LOG=warn "$README_BIN" "$@" "${listen[@]}" </dev/null >>"$README_DIR/server.log" 2>&1 &
    local pid=$!
    echo "$pid" >"$README_DIR/server.pid"
    local i
    for i in $(seq 200); do
        if curl -sf -o /dev/null "http://$README_PROXY_ADDR/healthz"; then return 0; fi
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "readme test: the proxy exited; its log:" >&2
            tail -n 20 "$README_DIR/server.log" >&2
            return 1
        fi
        sleep 0.1
    done
    echo "readme test: the proxy never answered /healthz" >&2
    return 1
}
__readme_stop() {
    [ -s "$README_DIR/server.pid" ] || return 0
    local pid i
    pid=$(cat "$README_DIR/server.pid")
    rm -f "$README_DIR/server.pid"
    kill -TERM "$pid" 2>/dev/null || return 0
    for i in $(seq 100); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.05
    done
    kill -KILL "$pid" 2>/dev/null
    return 0
}
"#;

struct Shell {
    dir: tempfile::TempDir,
    proxy: String,
    rules: Vec<(String, String)>,
    runs: usize,
}

/// What one block did.
struct Run {
    /// Per chunk: (stdout, stderr).
    outputs: Vec<(String, String)>,
    /// Commands that failed: (README line, status, command).
    failed: Vec<(usize, String, String)>,
    timed_out: bool,
}

impl Shell {
    fn new(proxy: &str, upstream: &str) -> Shell {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("prelude.sh"), PRELUDE).expect("prelude");
        Shell {
            dir,
            proxy: proxy.to_owned(),
            rules: rewrites(proxy, upstream),
            runs: 0,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(".readme-test").join(name)
    }

    /// Runs `chunks` of one block in a new bash that starts from the
    /// variables the blocks before it left.
    fn run(&mut self, chunks: &[Chunk]) -> Run {
        self.runs += 1;
        let n = self.runs;
        std::fs::create_dir_all(self.path("")).expect("test dir");
        let mut script = String::from(
            "source \"$README_DIR/../prelude.sh\"\n\
             compgen -v >\"$README_DIR/baseline\"\n\
             [ -f \"$README_DIR/state.sh\" ] && source \"$README_DIR/state.sh\"\n\
             trap 'printf \"%s\\t%s\\t%s\\t%s\\n\" \"$?\" \"${BASH_SOURCE[0]##*/}\" \"$LINENO\" \
             \"${BASH_COMMAND//$'\\n'/ }\" >>\"$README_DIR/errors\"' ERR\n",
        );
        for (i, chunk) in chunks.iter().enumerate() {
            let name = format!("b{n}-c{i}");
            std::fs::write(
                self.path(&format!("{name}.sh")),
                rewrite(&chunk.code, &self.rules),
            )
            .expect("chunk file");
            let _ = writeln!(
                script,
                "{{ source \"$README_DIR/{name}.sh\"; }} >\"$README_DIR/{name}.out\" 2>\"$README_DIR/{name}.err\""
            );
        }
        // Hand on every variable the blocks made (not the prelude's).
        script.push_str(
            "trap - ERR\n\
             declare -p $(compgen -v | grep -vxF -f \"$README_DIR/baseline\" \
             | grep -v -e '^BASH' -e '^_' -e '^PIPESTATUS$' -e '^FUNCNAME$') \
             >\"$README_DIR/state.next\" 2>/dev/null\n\
             mv \"$README_DIR/state.next\" \"$README_DIR/state.sh\"\n",
        );
        let errors = self.path("errors");
        let _ = std::fs::remove_file(&errors);
        let wrapper = self.path(&format!("b{n}.sh"));
        std::fs::write(&wrapper, script).expect("wrapper");
        let mut child = Command::new("bash")
            .args(["--noprofile", "--norc"])
            .arg(&wrapper)
            .current_dir(self.dir.path())
            .env("README_DIR", self.path(""))
            .env("README_BIN", BIN)
            .env("README_PROXY_ADDR", &self.proxy)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("bash starts");
        let started = Instant::now();
        let timed_out = loop {
            if child.try_wait().expect("wait for bash").is_some() {
                break false;
            }
            if started.elapsed() > BLOCK_LIMIT {
                let pgid = i32::try_from(child.id()).expect("pid fits");
                // SAFETY: kill(2) on the process group this test started.
                unsafe { libc::kill(-pgid, libc::SIGKILL) };
                let _ = child.wait();
                break true;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let read = |name: String| std::fs::read_to_string(self.path(&name)).unwrap_or_default();
        let outputs = (0..chunks.len())
            .map(|i| {
                (
                    read(format!("b{n}-c{i}.out")),
                    read(format!("b{n}-c{i}.err")),
                )
            })
            .collect();
        let failed = read("errors".into())
            .lines()
            .filter_map(|l| {
                let mut f = l.splitn(4, '\t');
                let (status, file, line, command) = (f.next()?, f.next()?, f.next()?, f.next()?);
                // Only commands of the README itself, not of the wrapper.
                let i: usize = file
                    .strip_prefix(&format!("b{n}-c"))?
                    .strip_suffix(".sh")?
                    .parse()
                    .ok()?;
                let line: usize = line.parse().ok()?;
                Some((
                    chunks[i].line + line - 1,
                    status.to_owned(),
                    command.to_owned(),
                ))
            })
            .collect();
        Run {
            outputs,
            failed,
            timed_out,
        }
    }

    /// Stops the proxy a block left running (by the pid the block wrote):
    /// SIGTERM, so that the demo stops its upstream process too, and
    /// SIGKILL if it is still there after a while.
    fn stop_server(&self) {
        let Ok(pid) = std::fs::read_to_string(self.path("server.pid")) else {
            return;
        };
        let _ = std::fs::remove_file(self.path("server.pid"));
        let Ok(pid) = pid.trim().parse::<i32>() else {
            return;
        };
        // SAFETY: kill(2) on a process this test started.
        let signal = |s| unsafe { libc::kill(pid, s) } == 0;
        if !signal(libc::SIGTERM) {
            return;
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while signal(0) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        signal(libc::SIGKILL);
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        self.stop_server();
    }
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("    | {l}\n")).collect()
}

#[test]
fn every_shell_block_runs_as_printed() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    // "Your own MCP server" of the quick start.
    let upstream = runtime
        .block_on(DemoUpstream::spawn(
            ([127, 0, 0, 1], 0).into(),
            DemoOptions::default(),
        ))
        .expect("demo upstream starts");
    let proxy = common::process::free_addr().to_string();
    let mut shell = Shell::new(&proxy, &upstream.addr.to_string());
    let (mut ran, mut compared, mut skipped) = (0, 0, Vec::new());
    let mut failures = String::new();
    for block in blocks().iter().filter(|b| b.is_shell()) {
        if let Some(why) = block.skip() {
            skipped.push(format!("README.md:{} skipped: {why}", block.fence));
            continue;
        }
        let chunks = chunks(block);
        let run = shell.run(&chunks);
        ran += 1;
        let mut failure = String::new();
        if run.timed_out {
            let _ = writeln!(failure, "  did not end within {BLOCK_LIMIT:?}");
        }
        for (line, status, command) in &run.failed {
            let _ = writeln!(
                failure,
                "  README.md:{line}: exit status {status}: {command}"
            );
        }
        for (chunk, (out, err)) in chunks.iter().zip(&run.outputs) {
            if !chunk.expected.is_empty() {
                compared += 1;
            }
            if let Some(missing) = compare(&chunk.expected, out) {
                let _ = writeln!(
                    failure,
                    "  README.md:{}: the output of the command at line {} lacks (README.md:{})\n{}  it printed:\n{}{}",
                    missing.line,
                    chunk.line,
                    missing.line,
                    indent(&missing.text),
                    indent(out),
                    if err.is_empty() { String::new() } else { format!("  and on stderr:\n{}", indent(err)) },
                );
                let _ = writeln!(failure, "  the command:\n{}", indent(&chunk.code));
            }
        }
        if !failure.is_empty() {
            let _ = writeln!(
                failures,
                "README.md:{} ```{}:\n{failure}",
                block.fence, block.lang
            );
        }
    }
    shell.stop_server();
    println!(
        "README shell blocks: {ran} run, {compared} commands compared, {} skipped",
        skipped.len()
    );
    for s in &skipped {
        println!("  {s}");
    }
    assert!(
        failures.is_empty(),
        "README shell blocks that do not run as printed:\n{failures}"
    );
}

// ---------------------------------------------------------------------------
// Configuration examples

#[test]
fn every_toml_block_is_a_valid_configuration() {
    let mut checked = 0;
    let mut failures = Vec::new();
    for block in blocks()
        .iter()
        .filter(|b| b.lang == "toml" && b.skip().is_none())
    {
        let mut text = block.lines.join("\n");
        if !text.contains("[[upstream]]") {
            // A fragment: the one key the loader requires besides it.
            text.push_str("\n[[upstream]]\nurl = \"http://127.0.0.1:1/mcp\"\n");
        }
        if let Err(e) = Config::from_toml(&text) {
            failures.push(format!("README.md:{} ```toml: {e}", block.fence));
        }
        checked += 1;
    }
    println!("README toml blocks: {checked} checked");
    assert!(checked > 0, "no toml block found");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Whether `nginx` runs here; in CI it must.
fn nginx() -> Option<PathBuf> {
    let found = ["/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/bin/nginx"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists());
    assert!(
        found.is_some() || std::env::var_os("CI").is_none(),
        "nginx is not installed (.ci/run installs it)"
    );
    found
}

/// The README's nginx example is a server's part of `http {}`: placed in a
/// whole file with its own prefix, so `nginx -t` touches nothing of the
/// machine's.
fn nginx_test(nginx: &Path, block: &str) -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let p = dir.path().display();
    let head = format!(
        "pid {p}/nginx.pid;\nerror_log stderr;\nevents {{}}\nhttp {{\n\
         access_log off;\nclient_body_temp_path {p}/body;\nproxy_temp_path {p}/proxy;\n\
         fastcgi_temp_path {p}/fastcgi;\nuwsgi_temp_path {p}/uwsgi;\nscgi_temp_path {p}/scgi;\n"
    );
    let conf = format!("{head}{block}\n}}\n");
    let first = head.lines().count() + 1;
    let file = dir.path().join("nginx.conf");
    std::fs::write(&file, conf).map_err(|e| e.to_string())?;
    let out = Command::new(nginx)
        .arg("-t")
        .arg("-p")
        .arg(dir.path())
        .arg("-c")
        .arg(&file)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}(the block is nginx.conf from line {first} on)",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Without nginx: braces balance and every directive ends with `;`.
fn nginx_syntax(block: &str) -> Result<(), String> {
    let mut depth = 0i32;
    for (i, line) in block.lines().enumerate() {
        let code = line.split('#').next().unwrap_or_default().trim();
        if code.is_empty() {
            continue;
        }
        depth += code.matches('{').count() as i32 - code.matches('}').count() as i32;
        if depth < 0 {
            return Err(format!("line {}: a `}}` closes nothing", i + 1));
        }
        if !(code.ends_with(';') || code.ends_with('{') || code.ends_with('}')) {
            return Err(format!("line {}: `{code}` does not end with `;`", i + 1));
        }
    }
    if depth == 0 {
        Ok(())
    } else {
        Err("unbalanced braces".into())
    }
}

#[test]
fn the_nginx_example_is_a_valid_nginx_configuration() {
    let nginx = nginx();
    let mut checked = 0;
    for block in blocks()
        .iter()
        .filter(|b| b.lang == "nginx" && b.skip().is_none())
    {
        let text = block.lines.join("\n");
        let checked_by = match &nginx {
            Some(nginx) => nginx_test(nginx, &text),
            None => nginx_syntax(&text),
        };
        if let Err(e) = checked_by {
            panic!("README.md:{} ```nginx:\n{e}", block.fence);
        }
        checked += 1;
    }
    println!(
        "README nginx blocks: {checked} checked ({})",
        if nginx.is_some() {
            "nginx -t"
        } else {
            "syntax only: nginx is not installed"
        }
    );
    assert!(checked > 0, "no nginx block found");
}

// ---------------------------------------------------------------------------
// The Kubernetes example

/// What a Kubernetes spec says of the container's probes, read line by
/// line: `key: value` pairs by indentation, enough for a README example
/// (no YAML library for one block).
#[derive(Debug, Default)]
struct Probes {
    termination_grace: Option<u64>,
    container_ports: Vec<u16>,
    /// (probe, path, port, periodSeconds, failureThreshold), with
    /// Kubernetes' defaults (10 s, 3) where unset.
    probes: Vec<Probe>,
}

#[derive(Debug, Clone)]
struct Probe {
    kind: String,
    path: String,
    port: u16,
    period: u64,
    failures: u64,
}

impl Probes {
    fn read(lines: &[String]) -> Result<Probes, String> {
        let mut spec = Probes::default();
        // The probe being read: its kind and indentation.
        let mut open: Option<(usize, Probe)> = None;
        for (i, raw) in lines.iter().enumerate() {
            let line = raw.split(" #").next().unwrap_or_default().trim_end();
            let text = line.trim_start().trim_start_matches("- ");
            if text.is_empty() || text.starts_with('#') {
                continue;
            }
            let indent = line.len() - line.trim_start().len();
            if open.as_ref().is_some_and(|(at, _)| indent <= *at) {
                spec.probes.extend(open.take().map(|(_, p)| p));
            }
            let (key, value) = text
                .split_once(':')
                .ok_or_else(|| format!("line {}: not `key: value`: {raw}", i + 1))?;
            let value = value.trim();
            let number = || {
                value
                    .parse::<u64>()
                    .map_err(|_| format!("line {}: {key} is not a number: {value:?}", i + 1))
            };
            match (key, &mut open) {
                ("livenessProbe" | "readinessProbe" | "startupProbe", _) => {
                    let probe = Probe {
                        kind: key.to_owned(),
                        path: String::new(),
                        port: 0,
                        period: 10,
                        failures: 3,
                    };
                    open = Some((indent, probe));
                }
                ("path", Some((_, p))) => p.path = value.to_owned(),
                ("port", Some((_, p))) => {
                    p.port = u16::try_from(number()?).map_err(|e| e.to_string())?
                }
                ("periodSeconds", Some((_, p))) => p.period = number()?,
                ("failureThreshold", Some((_, p))) => p.failures = number()?,
                ("terminationGracePeriodSeconds", _) => spec.termination_grace = Some(number()?),
                ("containerPort", _) => spec
                    .container_ports
                    .push(u16::try_from(number()?).map_err(|e| e.to_string())?),
                _ => {}
            }
        }
        spec.probes.extend(open.map(|(_, p)| p));
        Ok(spec)
    }

    fn probe(&self, kind: &str) -> Option<&Probe> {
        self.probes.iter().find(|p| p.kind == kind)
    }
}

/// What is wrong with `spec` as the deployment of `config`.
fn misfits(spec: &Probes, config: &Config) -> Vec<String> {
    let mut wrong = Vec::new();
    let port = config.listen.port();
    if !spec.container_ports.contains(&port) {
        wrong.push(format!(
            "no containerPort {port} (listen = {})",
            config.listen
        ));
    }
    for p in &spec.probes {
        if p.port != port {
            wrong.push(format!(
                "{} asks port {}, the proxy listens on {port}",
                p.kind, p.port
            ));
        }
    }
    match spec.probe("livenessProbe") {
        Some(p) if p.path == "/livez" => {}
        other => wrong.push(format!(
            "the livenessProbe must ask /livez (a drain or a Redis outage is nothing a restart \
             fixes), not {other:?}"
        )),
    }
    match spec.probe("readinessProbe") {
        Some(p) if p.path == "/readyz" => {
            if p.period * p.failures > config.drain_delay_secs {
                wrong.push(format!(
                    "readiness fails only after {} s, past drain_delay_secs = {}",
                    p.period * p.failures,
                    config.drain_delay_secs
                ));
            }
        }
        other => wrong.push(format!(
            "the readinessProbe must ask /readyz, not {other:?}"
        )),
    }
    // Kubernetes' default is 30 s; the flush and the hand-over get 5 s.
    let grace = spec.termination_grace.unwrap_or(30);
    let needed = config.drain_delay_secs + config.shutdown_grace_secs + 5;
    if grace < needed {
        wrong.push(format!(
            "terminationGracePeriodSeconds = {grace} leaves no time for drain_delay_secs + \
             shutdown_grace_secs + 5 = {needed}"
        ));
    }
    wrong
}

#[test]
fn the_kubernetes_example_probes_answer_and_fit_the_drain() {
    let blocks = blocks();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let mut checked = 0;
    for (i, block) in blocks.iter().enumerate() {
        if block.lang != "yaml" || block.skip().is_some() {
            continue;
        }
        let toml = blocks[..i]
            .iter()
            .rev()
            .find(|b| b.lang == "toml")
            .unwrap_or_else(|| panic!("README.md:{}: no toml block before it", block.fence));
        let mut text = toml.lines.join("\n");
        if !text.contains("[[upstream]]") {
            text.push_str("\n[[upstream]]\nurl = \"http://127.0.0.1:1/mcp\"\n");
        }
        let config = Config::from_toml(&text).expect("the toml block before it loads");
        let spec = Probes::read(&block.lines)
            .unwrap_or_else(|e| panic!("README.md:{} ```yaml: {e}", block.fence));
        let wrong = misfits(&spec, &config);
        assert!(
            wrong.is_empty(),
            "README.md:{} ```yaml does not fit the toml of README.md:{}:\n{}",
            block.fence,
            toml.fence,
            wrong.join("\n")
        );
        // The proxy of that file, on a loopback port of this test.
        let dir = tempfile::tempdir().expect("temp dir");
        let config = Config {
            listen: ([127, 0, 0, 1], 0).into(),
            data_dir: dir.path().to_path_buf(),
            ..config
        };
        runtime.block_on(async {
            let server = mcp_resume_proxy::Server::start(config)
                .await
                .expect("the proxy of the toml block starts");
            for probe in &spec.probes {
                let url = format!("http://{}{}", server.addr, probe.path);
                let status = common::McpClient::new(url)
                    .send(common::Call::get())
                    .await
                    .status();
                assert_eq!(
                    status,
                    http::StatusCode::OK,
                    "README.md:{}: the {} on {}",
                    block.fence,
                    probe.kind,
                    probe.path
                );
            }
            server.shutdown().await;
        });
        checked += 1;
    }
    println!("README yaml blocks: {checked} checked");
    assert!(checked > 0, "no yaml block found");
}

#[test]
fn a_probe_spec_that_does_not_fit_the_drain_is_caught() {
    let config = Config::from_toml(
        "drain_delay_secs = 2\nshutdown_grace_secs = 5\n[[upstream]]\nurl = \"http://a/\"\n",
    )
    .expect("config");
    let yaml: Vec<String> = "terminationGracePeriodSeconds: 5\n\
         ports:\n  - containerPort: 8080\n\
         livenessProbe:\n  httpGet:\n    path: /readyz\n    port: 8080\n\
         readinessProbe:\n  httpGet:\n    path: /readyz\n    port: 8080\n  periodSeconds: 5\n"
        .lines()
        .map(str::to_owned)
        .collect();
    let spec = Probes::read(&yaml).expect("reads");
    let wrong = misfits(&spec, &config).join("\n");
    for what in [
        "livenessProbe must ask /livez",
        "readiness fails only after 15 s",
        "terminationGracePeriodSeconds = 5",
    ] {
        assert!(wrong.contains(what), "{what} not in\n{wrong}");
    }
}

// ---------------------------------------------------------------------------
// The synopsis and the marks

/// The long flags and the subcommands `--help` lists, and those of each
/// subcommand's `--help`, all the way down.
fn help_words(command: &[&str], flags: &mut Vec<String>, commands: &mut Vec<String>) {
    let out = Command::new(BIN)
        .args(command)
        .arg("--help")
        .output()
        .expect("--help runs");
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut section = "";
    let mut subcommands = Vec::new();
    for line in help.lines() {
        if !line.starts_with(' ') {
            section = line.trim_end_matches(':');
            continue;
        }
        let first = line.split_whitespace().next().unwrap_or_default();
        match section {
            "Commands" if first != "help" => subcommands.push(first.to_owned()),
            "Options" => {
                let flag = line.split_whitespace().find(|w| w.starts_with("--"));
                if let Some(flag) = flag.map(|w| w.trim_end_matches(',')) {
                    let known = flags.iter().any(|f| f == flag);
                    if !known && flag != "--help" && flag != "--version" {
                        flags.push(flag.to_owned());
                    }
                }
            }
            _ => {}
        }
    }
    for sub in subcommands {
        let mut path = command.to_vec();
        path.push(&sub);
        help_words(&path, flags, commands);
        commands.push(sub);
    }
}

#[test]
fn the_synopsis_names_every_flag_and_subcommand_of_help() {
    let blocks = blocks();
    let synopsis: Vec<&Block> = blocks
        .iter()
        .filter(|b| b.mark == Some(Mark::Synopsis))
        .collect();
    assert_eq!(synopsis.len(), 1, "one block marked synopsis");
    let text = synopsis[0].lines.join("\n");
    let (mut flags, mut commands) = (Vec::new(), Vec::new());
    help_words(&[], &mut flags, &mut commands);
    assert!(!flags.is_empty() && !commands.is_empty(), "--help was read");
    for word in flags.iter().chain(&commands) {
        let named = text
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .any(|w| w == word);
        assert!(
            named,
            "README.md:{}: the synopsis lacks `{word}` (--help has it)",
            synopsis[0].fence
        );
    }
    for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-')) {
        if word.starts_with("--") {
            assert!(
                flags.iter().any(|f| f == word),
                "the synopsis names `{word}`, which --help does not know"
            );
        }
    }
}

#[test]
fn every_block_is_checked_or_skipped_with_a_reason() {
    let blocks = blocks();
    let mut unchecked = Vec::new();
    for b in &blocks {
        let known = b.is_shell()
            || matches!(b.lang.as_str(), "toml" | "nginx" | "yaml")
            || b.mark == Some(Mark::Synopsis)
            || b.skip().is_some();
        if !known {
            unchecked.push(format!("README.md:{} ```{}", b.fence, b.lang));
        }
    }
    assert!(
        unchecked.is_empty(),
        "blocks this test cannot check (give them sh, bash, console, toml, nginx or yaml, or mark them):\n{}",
        unchecked.join("\n")
    );
    // Skips stay few: each one is a part of the README nobody checks.
    let skips = blocks.iter().filter(|b| b.skip().is_some()).count();
    assert!(skips <= 6, "{skips} blocks skipped: run them instead");
}

// ---------------------------------------------------------------------------
// The matcher itself

#[test]
fn an_ellipsis_and_example_ids_match_anything_and_spacing_is_loose() {
    let items = [Expected {
        line: 1,
        text: r#"data: {"id":2,"result":{"token":"AhzYne6z…", "at":"2026-11-23T19:50:28.152Z"},…}"#
            .into(),
    }];
    let output = "id: x\ndata: {\"id\":2,\"result\":{\"token\":\"Qx9_-k\",\"at\":\"2027-01-01T00:00:00Z\"},\"more\":1}\n";
    assert!(compare(&items, output).is_none());
    assert!(compare(&items, "data: {\"id\":3}").is_some());
}

#[test]
fn only_output_like_comment_lines_are_compared() {
    let comments = [
        (1, "# {\"a\":1,"),
        (2, "#    \"b\":2}"),
        (3, "# progress since the last answer, then live"),
        (4, "#  mcp-session-id: 4bafbe58…"),
    ];
    let items = expected(&comments);
    assert_eq!(items.len(), 2, "{items:?}");
    assert_eq!(items[0].text, "{\"a\":1, \"b\":2}");
    assert!(compare(&items, "{\"a\":1,\"b\":2}\nmcp-session-id: 0af3\n").is_none());
}
