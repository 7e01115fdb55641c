//! The `mcp-resume-proxy` binary: parses the command line, loads and checks
//! the configuration, sets up logging, and runs the proxy (or the demo).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use mcp_resume_proxy::config::traces::OtelEnv;
use mcp_resume_proxy::config::{Config, LogFormat, UpstreamConfig};

/// A reverse proxy that makes the requests of unmodified MCP servers resumable.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Cli {
    /// TOML configuration file (see proxy.toml.example).
    #[arg(long, short, value_name = "FILE", global = true)]
    config: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:8080].
    #[arg(long, value_name = "ADDR", global = true)]
    listen: Option<std::net::SocketAddr>,
    /// Upstream MCP endpoint (Streamable HTTP), mounted at /mcp. Replaces the
    /// file's [[upstream]] tables.
    #[arg(long, value_name = "URL", conflicts_with = "upstream_command")]
    upstream: Option<String>,
    /// Upstream stdio MCP server, e.g. "npx -y @modelcontextprotocol/server-everything stdio"
    /// (split like a shell would; one child per session), mounted at /mcp.
    #[arg(long, value_name = "CMD")]
    upstream_command: Option<String>,
    /// Directory for the durable log [default: ./mcp-resume-proxy-data].
    #[arg(long, value_name = "DIR", global = true)]
    data_dir: Option<PathBuf>,
    /// Log output format.
    #[arg(long, value_enum, global = true)]
    log_format: Option<LogFormat>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Runs a demo MCP server with a slow tool behind the proxy and prints
    /// curl commands that drop a call and resume it.
    Demo,
    /// Shows the streams in the data directory's log (read-only; safe while
    /// the proxy runs).
    Streams {
        #[command(subcommand)]
        action: StreamsCommand,
    },
    /// Checks the configuration (the file, the flags, the TLS files it
    /// names) without starting anything: exits 0 when the proxy would start
    /// with it, 2 with the reason when it would not. For CI, and before a
    /// reload.
    Check,
    /// Checks the configuration as `check` does, then has the proxy running
    /// on its data directory apply it (SIGHUP): exits 0 once signalled (the
    /// proxy's log says whether it applied it), 2 when the configuration is
    /// invalid, 1 when no proxy runs there.
    Reload,
    /// Runs the demo MCP server on stdin/stdout (a stdio upstream for tests
    /// and experiments).
    #[command(hide = true)]
    DemoStdioServer,
    /// The demo's upstream, in a process of its own so that it outlives a
    /// kill -9 of the demo (started by `demo`; FILE names its owner).
    #[command(hide = true, name = "demo-upstream")]
    DemoUpstream { file: PathBuf },
}

#[derive(Subcommand, Debug)]
enum StreamsCommand {
    /// One line per stream: ids, status, counts, times, cursors.
    List {
        /// Only streams still live.
        #[arg(long)]
        live: bool,
        /// Only the streams of this session (a prefix of its id will do).
        #[arg(long, value_name = "ID")]
        session: Option<String>,
        /// JSON lines instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// One stream's metadata and its last entries.
    Show {
        /// The stream id (a unique prefix will do).
        id: String,
        /// How many of the newest entries to show.
        #[arg(long, value_name = "N", default_value_t = 20)]
        entries: usize,
        /// One JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// `streams list|show`: exits 1 on any error (unknown stream, no log).
fn streams(cli: &Cli, action: &StreamsCommand, runtime: &tokio::runtime::Runtime) -> ExitCode {
    use mcp_resume_proxy::inspect;
    let config = match config(cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mcp-resume-proxy: invalid configuration: {e}");
            return ExitCode::from(2);
        }
    };
    // Without a configuration file the directory says which backend wrote it.
    let source = inspect::Source {
        data_dir: &config.data_dir,
        backend: cli.config.is_some().then_some(config.store.backend),
        store: &config.store,
    };
    let (mut out, mut err) = (std::io::stdout().lock(), std::io::stderr());
    let done = runtime.block_on(async {
        match action {
            StreamsCommand::List {
                live,
                session,
                json,
            } => {
                let options = inspect::ListOptions {
                    live: *live,
                    session: session.clone(),
                    json: *json,
                };
                inspect::list(&source, &options, &mut out, &mut err).await
            }
            StreamsCommand::Show { id, entries, json } => {
                let options = inspect::ShowOptions {
                    id: id.clone(),
                    entries: *entries,
                    json: *json,
                };
                inspect::show(&source, &options, &mut out, &mut err).await
            }
        }
    });
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mcp-resume-proxy: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn config(cli: &Cli) -> Result<Config, String> {
    let mut config = match &cli.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            toml::from_str::<Config>(&text).map_err(|e| format!("{}: {e}", path.display()))?
        }
        None => Config::default(),
    };
    if let Some(listen) = cli.listen {
        config.listen = listen;
    }
    if let Some(url) = &cli.upstream {
        config.upstream = vec![UpstreamConfig::new(url.clone())];
    }
    if let Some(line) = &cli.upstream_command {
        let argv = shlex::split(line)
            .ok_or_else(|| format!("--upstream-command {line:?}: unbalanced quotes"))?;
        config.upstream = vec![UpstreamConfig::command(argv)];
    }
    if let Some(dir) = &cli.data_dir {
        config.data_dir = dir.clone();
    }
    if let Some(format) = cli.log_format {
        config.log_format = format;
    }
    // `[tracing]` falls back on the standard OTEL_* variables.
    let env = OtelEnv::read(|name| std::env::var(name).ok());
    config.tracing = config.tracing.with_env(env);
    Ok(config)
}

/// The configuration the proxy would run with, checked as at start: its
/// values, and the TLS files it names (a file that cannot be read is as much
/// a configuration error as a key that cannot be parsed: both exit with
/// status 2).
fn checked_config(cli: &Cli) -> Result<Config, String> {
    config(cli)
        .and_then(|c| c.validate().map(|()| c).map_err(|e| e.0))
        .and_then(|c| {
            mcp_resume_proxy::tls::check_files(&c)
                .map(|()| c)
                .map_err(|e| e.to_string())
        })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("mcp-resume-proxy: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(Command::DemoStdioServer) = cli.command {
        let stats = std::sync::Arc::new(mcp_resume_proxy::demo::upstream::DemoStats::default());
        let served = runtime.block_on(mcp_resume_proxy::demo::stdio::serve(
            tokio::io::stdin(),
            tokio::io::stdout(),
            stats,
        ));
        // A blocking read of stdin would keep the runtime from dropping, so
        // leave it behind: the process is done either way.
        runtime.shutdown_background();
        return match served {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("demo stdio server: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(Command::DemoUpstream { file }) = &cli.command {
        return match runtime.block_on(mcp_resume_proxy::demo::process::serve(file)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("demo upstream: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(Command::Streams { action }) = &cli.command {
        return streams(&cli, action, &runtime);
    }
    if let Some(Command::Demo) = cli.command {
        let mut config = match config(&cli) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("mcp-resume-proxy: invalid configuration: {e}");
                return ExitCode::from(2);
            }
        };
        if cli.data_dir.is_none() && cli.config.is_none() {
            config.data_dir = PathBuf::from("./mcp-resume-proxy-demo-data");
        }
        let _log = mcp_resume_proxy::logging::init(config.log_format);
        return match runtime.block_on(mcp_resume_proxy::demo::run(config)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("mcp-resume-proxy: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    let config = match checked_config(&cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mcp-resume-proxy: invalid configuration: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(Command::Reload) = cli.command {
        return match mcp_resume_proxy::pid_file::signal_reload(&config.data_dir) {
            Ok(pid) => {
                println!("sent SIGHUP to the proxy (pid {pid}); its log says whether the configuration applied");
                ExitCode::SUCCESS
            }
            Err(why) => {
                eprintln!("mcp-resume-proxy: {why}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(Command::Check) = cli.command {
        let what = cli
            .config
            .as_ref()
            .map_or_else(|| "the flags".into(), |f| f.display().to_string());
        println!("{what}: the configuration is valid");
        return ExitCode::SUCCESS;
    }
    let _log = mcp_resume_proxy::logging::init(config.log_format);
    let ran = runtime.block_on(mcp_resume_proxy::run(config, || checked_config(&cli)));
    // What the runtime's tasks log as they are dropped is still written:
    // the log's buffer is written out after this.
    drop(runtime);
    match ran {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mcp-resume-proxy: {e:#}");
            ExitCode::FAILURE
        }
    }
}
