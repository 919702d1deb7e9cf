//! The `poolgate` command: run the gateway, check a config, or print a running gateway's status.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use poolgate::config::Config;

/// Exit status for a config that does not validate (EX_CONFIG is 78; 64 is EX_USAGE: the
/// operator's input is wrong either way, and scripts only need "not zero").
const EXIT_BAD_CONFIG: u8 = 64;

/// mimalloc instead of glibc's malloc: glibc's aligned allocations (every tokio task) and its
/// consolidation of freed tunnel buffers took a fifth of a CONNECT setup's instructions. With
/// mimalloc a setup costs 13% fewer, and about 15% less user CPU; peak RSS under load is about
/// 10 MiB higher (docs/performance.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "poolgate",
    version,
    about = "HTTP forward-proxy gateway that pools upstream proxies"
)]
struct Cli {
    /// Config file.
    #[arg(long, short, global = true, default_value = "gateway.toml")]
    config: PathBuf,
    /// Log format.
    #[arg(long, global = true, value_parser = ["text", "json"], default_value = "text")]
    log_format: String,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway (the default).
    Run,
    /// Validate the config file and exit: 0 when valid, non-zero with every problem listed.
    /// Risks in a valid config (an admin listener beyond loopback, private targets reachable
    /// through a direct upstream, a client allowlist that admits everyone) are warned about.
    Check,
    /// Read a password from standard input (one line) and print its argon2 hash, for
    /// `password_hash` in `[auth.users.<name>]`.
    HashPassword,
    /// Print the admin /status of a running gateway.
    Status {
        /// Admin address; defaults to the config's server.admin_listen.
        #[arg(long)]
        admin: Option<String>,
        /// Print the raw JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Token for an admin listener whose reads need one (server.admin_read_token or
        /// server.admin_token). Prefer the POOLGATE_ADMIN_TOKEN variable: arguments show in
        /// process lists. Without either, the config's tokens are used when it is read for the
        /// address.
        #[arg(long)]
        token: Option<String>,
    },
    /// The TLS interception CA.
    Ca {
        #[command(subcommand)]
        command: CaCommand,
    },
}

#[derive(Subcommand)]
enum CaCommand {
    /// Write a new CA certificate and key (the key readable by its owner only).
    Init {
        /// Where to write the CA certificate (PEM): give it to clients to trust.
        #[arg(long, default_value = "poolgate-ca.pem")]
        cert: PathBuf,
        /// Where to write the CA key (PEM, PKCS#8): secret, read by the gateway only.
        #[arg(long, default_value = "poolgate-ca-key.pem")]
        key: PathBuf,
        /// Common name of the CA, as clients show it.
        #[arg(long, default_value = poolgate::intercept::ca::DEFAULT_CA_COMMON_NAME)]
        name: String,
        /// Overwrite existing files.
        #[arg(long)]
        force: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(&cli.log_format);
    match cli.command.unwrap_or(Command::Run) {
        Command::Check => match Config::load(&cli.config) {
            Ok(c) => {
                // A malformed line is skipped at run time, not refused; say so here as well.
                let mut from_files = Vec::new();
                for p in c.pools.values() {
                    let Some(path) = &p.sources.file else {
                        continue;
                    };
                    if let Ok(text) = std::fs::read_to_string(path) {
                        let listed =
                            poolgate::sources::list::parse(&text, &path.display().to_string());
                        for why in listed.skipped {
                            eprintln!(
                                "warning: pools.{}.upstreams_file: {why} (the line is skipped)",
                                p.name
                            );
                        }
                        from_files.push((p.name.as_str(), listed.upstreams));
                    }
                }
                let listed: Vec<_> = from_files
                    .iter()
                    .map(|(pool, ups)| (*pool, ups.as_slice()))
                    .collect();
                for warning in c.warnings(&listed) {
                    eprintln!("warning: {warning}");
                }
                let lists = c.pools.values().filter(|p| !p.sources.is_empty()).count();
                println!(
                    "{}: ok ({} pool(s), {} inline upstream(s){})",
                    cli.config.display(),
                    c.pools.len(),
                    c.pools.values().map(|p| p.upstreams.len()).sum::<usize>(),
                    if lists > 0 {
                        format!(", {lists} pool(s) with upstream lists read at run time")
                    } else {
                        String::new()
                    }
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                eprintln!("poolgate run refuses to start with this config until these are fixed");
                ExitCode::from(EXIT_BAD_CONFIG)
            }
        },
        Command::Run => {
            let config = match Config::load(&cli.config) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::from(EXIT_BAD_CONFIG);
                }
            };
            let rt = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("poolgate: cannot start the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let code = rt.block_on(poolgate::app::run(config, Some(cli.config.clone())));
            // Tunnels still open after the grace period are abandoned, not awaited.
            rt.shutdown_timeout(std::time::Duration::from_millis(100));
            ExitCode::from(code as u8)
        }
        Command::HashPassword => {
            let mut line = String::new();
            if let Err(e) = std::io::stdin().read_line(&mut line) {
                eprintln!("poolgate hash-password: cannot read standard input: {e}");
                return ExitCode::FAILURE;
            }
            let password = line.trim_end_matches(['\r', '\n']);
            if password.is_empty() {
                eprintln!("poolgate hash-password: give the password on standard input");
                return ExitCode::from(EXIT_BAD_CONFIG);
            }
            match poolgate::auth::hash_password(password) {
                Ok(hash) => {
                    println!("{hash}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("poolgate hash-password: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Ca {
            command:
                CaCommand::Init {
                    cert,
                    key,
                    name,
                    force,
                },
        } => match poolgate::intercept::ca::write_new(&cert, &key, &name, force) {
            Ok(()) => {
                println!(
                    "wrote CA certificate {} and key {} (keep the key secret)\n\
                     next: make clients trust {}, then set [intercept] ca_cert and ca_key, and \
                     inspect_tls = true on a pool",
                    cert.display(),
                    key.display(),
                    cert.display()
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("poolgate ca init: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Status { admin, json, token } => {
            use poolgate::admin::client::{TOKEN_ENV, fetch_status};
            let mut token =
                token.or_else(|| std::env::var(TOKEN_ENV).ok().filter(|t| !t.is_empty()));
            let addr = match admin {
                Some(a) => a,
                None => match Config::load(&cli.config) {
                    Ok(c) => {
                        if token.is_none() {
                            token = c.server.admin_read_token.or(c.server.admin_token);
                        }
                        c.server.admin_listen.to_string()
                    }
                    Err(e) => {
                        eprintln!("{e}");
                        return ExitCode::from(EXIT_BAD_CONFIG);
                    }
                },
            };
            let shown = fetch_status(&addr, token.as_deref()).and_then(|body| {
                if json {
                    Ok(body)
                } else {
                    poolgate::admin::client::render_table(&body)
                }
            });
            match shown {
                Ok(text) => {
                    println!("{text}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("poolgate status: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn init_tracing(format: &str) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("POOLGATE_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    use std::io::IsTerminal as _;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}
