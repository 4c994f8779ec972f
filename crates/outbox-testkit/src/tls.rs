//! TLS switched on at run time on the local PostgreSQL, RabbitMQ and Redis, for the
//! `tls_*` tests, without disturbing anyone else using them: nothing is restarted,
//! and plain connections keep working throughout.
//!
//! - [`TestPki`]: a CA, a server certificate for `IP:127.0.0.1` only (so
//!   `localhost` is a wrong host name), a client certificate and an unrelated CA,
//!   made with the `openssl` command.
//! - [`PgTlsSetup`]: PostgreSQL serves the test's certificate (`ALTER SYSTEM SET
//!   ssl_cert_file, ssl_key_file` + `pg_reload_conf()`; `ssl` itself is only turned
//!   on when it was off), and a dedicated role [`PG_TLS_ROLE`] may connect only over
//!   TLS (two `pg_hba.conf` lines for that role alone, put first).
//! - [`RedisTlsSetup`]: a TLS port beside the plain one (`CONFIG SET tls-*`, then
//!   `tls-port`).
//! - [`RabbitTlsSetup`]: an extra TLS listener on the running broker
//!   (`rabbit_networking:start_ssl_listener/3` through `rabbitmqctl eval`).
//!
//! Each setup first undoes what a crashed earlier run may have left (recognised by
//! [`MARKER`] or by its own port), and undoes its own changes when dropped, also
//! when the test panics. The commands are run with the local services' own tools
//! (`psql`, `redis-cli`, `rabbitmqctl`) as the machine's administrator, as the
//! other service helpers do ([`crate::services`]).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Written next to everything a setup adds, so leftovers can be found.
pub const MARKER: &str = "outbox-tls-test";

/// The PostgreSQL role that may connect only over TLS while [`PgTlsSetup`] lives.
pub const PG_TLS_ROLE: &str = "outbox_tls_only";

/// The port of the extra RabbitMQ TLS listener.
pub const RABBIT_TLS_PORT: u16 = 5699;

/// The port of Redis' TLS listener.
pub const REDIS_TLS_PORT: u16 = 6390;

/// Whether the tests run in CI (`CI=true`), where a setup that cannot be made must
/// fail the test instead of skipping it.
#[must_use]
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Runs `program` and returns its standard output, or an error with its standard
/// error.
fn output(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(format!(
            "{program} {} failed ({}): {}{}",
            args.first().copied().unwrap_or_default(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        ))
    }
}

/// A CA, a server certificate for `127.0.0.1` signed by it, a client certificate
/// signed by it, and a second CA that signed nothing of these, in a fresh
/// directory removed on drop.
#[derive(Debug)]
pub struct TestPki {
    dir: PathBuf,
    /// The CA certificate (PEM).
    pub ca: PathBuf,
    /// A CA that did not sign the server certificate (PEM).
    pub other_ca: PathBuf,
    /// The server certificate, `subjectAltName = IP:127.0.0.1` only (PEM).
    pub server_cert: PathBuf,
    /// Its private key (PKCS#8 PEM).
    pub server_key: PathBuf,
    /// A client certificate signed by the CA, `CN=outbox-test-client` (PEM).
    pub client_cert: PathBuf,
    /// Its private key (PKCS#8 PEM).
    pub client_key: PathBuf,
}

impl TestPki {
    /// Makes the certificates with the `openssl` command (valid for two days).
    ///
    /// # Errors
    /// `openssl` missing or failing.
    pub fn generate(tag: &str) -> Result<Self, String> {
        use std::os::unix::fs::PermissionsExt as _;
        let id = uuid::Uuid::now_v7().simple().to_string();
        let dir = std::env::temp_dir().join(format!("{MARKER}-{tag}-{}-{id}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        // The broker runs as its own user: it must read the server's files.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| e.to_string())?;
        let p = |name: &str| dir.join(name);
        let s = |path: &Path| path.to_string_lossy().into_owned();
        let ca_ext = "basicConstraints=critical,CA:TRUE";
        // Names unique per run: a server still presenting an earlier run's
        // certificate then fails as an unknown issuer, never as something stranger.
        for (name, cn) in [
            ("ca", format!("outbox test CA {id}")),
            ("other-ca", format!("outbox other CA {id}")),
        ] {
            output(
                "openssl",
                &[
                    "req",
                    "-x509",
                    "-newkey",
                    "ec",
                    "-pkeyopt",
                    "ec_paramgen_curve:P-256",
                    "-nodes",
                    "-days",
                    "2",
                    "-subj",
                    &format!("/CN={cn}"),
                    "-addext",
                    ca_ext,
                    "-addext",
                    "keyUsage=critical,keyCertSign,cRLSign",
                    "-keyout",
                    &s(&p(&format!("{name}.key"))),
                    "-out",
                    &s(&p(&format!("{name}.pem"))),
                ],
            )?;
        }
        for (name, cn, ext) in [
            (
                "server",
                "127.0.0.1",
                "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
            ),
            (
                "client",
                "outbox-test-client",
                "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n",
            ),
        ] {
            std::fs::write(p(&format!("{name}.ext")), ext).map_err(|e| e.to_string())?;
            output(
                "openssl",
                &[
                    "req",
                    "-newkey",
                    "ec",
                    "-pkeyopt",
                    "ec_paramgen_curve:P-256",
                    "-nodes",
                    "-subj",
                    &format!("/CN={cn}"),
                    "-keyout",
                    &s(&p(&format!("{name}.key"))),
                    "-out",
                    &s(&p(&format!("{name}.csr"))),
                ],
            )?;
            output(
                "openssl",
                &[
                    "x509",
                    "-req",
                    "-days",
                    "2",
                    "-in",
                    &s(&p(&format!("{name}.csr"))),
                    "-CA",
                    &s(&p("ca.pem")),
                    "-CAkey",
                    &s(&p("ca.key")),
                    "-CAcreateserial",
                    "-extfile",
                    &s(&p(&format!("{name}.ext"))),
                    "-out",
                    &s(&p(&format!("{name}.pem"))),
                ],
            )?;
        }
        for entry in std::fs::read_dir(&dir).map_err(|e| e.to_string())? {
            let path = entry.map_err(|e| e.to_string())?.path();
            // Throwaway test keys; the broker's user must read the server's.
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))
                .map_err(|e| e.to_string())?;
        }
        Ok(Self {
            ca: p("ca.pem"),
            other_ca: p("other-ca.pem"),
            server_cert: p("server.pem"),
            server_key: p("server.key"),
            client_cert: p("client.pem"),
            client_key: p("client.key"),
            dir,
        })
    }
}

impl Drop for TestPki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn wait_for(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        if ok() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!("{what}: not in effect within {timeout:?}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

// ---------------------------------------------------------------- PostgreSQL

/// PostgreSQL serving the test's server certificate, and [`PG_TLS_ROLE`] allowed
/// only over TLS. Dropping it restores the previous configuration (reload only).
#[derive(Debug)]
pub struct PgTlsSetup {
    admin_url: String,
    files: PathBuf,
    hba_file: PathBuf,
    turned_ssl_on: bool,
}

fn psql(url: &str, statements: &[&str]) -> Result<String, String> {
    let mut args = vec!["-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-d", url];
    for s in statements {
        // Each -c is its own transaction: ALTER SYSTEM refuses to run inside one.
        args.extend(["-c", s]);
    }
    output("psql", &args)
}

fn quote_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

impl PgTlsSetup {
    /// Switches it on through `admin_url` (a superuser on the local server, whose
    /// data directory this process can write, as root).
    ///
    /// # Errors
    /// What failed; anything already changed is undone.
    pub fn enable(admin_url: &str, pki: &TestPki) -> Result<Self, String> {
        Self::undo_leftovers(admin_url)?;
        let data = PathBuf::from(psql(admin_url, &["SHOW data_directory"])?);
        let hba_file = PathBuf::from(psql(admin_url, &["SHOW hba_file"])?);
        let ssl_on = psql(admin_url, &["SHOW ssl"])? == "on";
        let files = data.join(MARKER);
        let mut setup = Self {
            admin_url: admin_url.to_owned(),
            files: files.clone(),
            hba_file,
            turned_ssl_on: false,
        };
        setup.install_files(&data, pki)?;
        let cert = files.join("server.pem");
        let key = files.join("server.key");
        let mut statements = vec![
            format!(
                "ALTER SYSTEM SET ssl_cert_file = {}",
                quote_literal(&cert.to_string_lossy())
            ),
            format!(
                "ALTER SYSTEM SET ssl_key_file = {}",
                quote_literal(&key.to_string_lossy())
            ),
            format!(
                "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{PG_TLS_ROLE}') THEN CREATE ROLE {PG_TLS_ROLE} LOGIN; END IF; END $$"
            ),
        ];
        if !ssl_on {
            statements.push("ALTER SYSTEM SET ssl = on".to_owned());
            setup.turned_ssl_on = true;
        }
        let statements: Vec<&str> = statements.iter().map(String::as_str).collect();
        psql(admin_url, &statements)?;
        setup.add_hba_lines()?;
        psql(admin_url, &["SELECT pg_reload_conf()"])?;
        let expected = cert.to_string_lossy().into_owned();
        wait_for("PostgreSQL ssl_cert_file", Duration::from_secs(10), || {
            psql(admin_url, &["SHOW ssl_cert_file"]).is_ok_and(|v| v == expected)
        })?;
        let errors = psql(
            admin_url,
            &["SELECT count(*) FROM pg_hba_file_rules WHERE error IS NOT NULL"],
        )?;
        if errors != "0" {
            return Err(format!("pg_hba.conf has {errors} erroneous lines"));
        }
        Ok(setup)
    }

    fn install_files(&self, data: &Path, pki: &TestPki) -> Result<(), String> {
        use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
        let owner = std::fs::metadata(data).map_err(|e| format!("{}: {e}", data.display()))?;
        let chown = |p: &Path| {
            std::os::unix::fs::chown(p, Some(owner.uid()), Some(owner.gid()))
                .map_err(|e| format!("chown {}: {e}", p.display()))
        };
        let mode = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m))
                .map_err(|e| format!("chmod {}: {e}", p.display()))
        };
        std::fs::create_dir_all(&self.files)
            .map_err(|e| format!("{}: {e}", self.files.display()))?;
        chown(&self.files)?;
        mode(&self.files, 0o700)?;
        for (from, to, m) in [
            (&pki.server_cert, "server.pem", 0o644),
            // PostgreSQL refuses a key others can read.
            (&pki.server_key, "server.key", 0o600),
        ] {
            let to = self.files.join(to);
            std::fs::copy(from, &to).map_err(|e| format!("{}: {e}", to.display()))?;
            chown(&to)?;
            mode(&to, m)?;
        }
        Ok(())
    }

    fn add_hba_lines(&self) -> Result<(), String> {
        let old = std::fs::read_to_string(&self.hba_file)
            .map_err(|e| format!("{}: {e}", self.hba_file.display()))?;
        let new = format!(
            "hostnossl all {PG_TLS_ROLE} 127.0.0.1/32 reject # {MARKER}\nhostssl all {PG_TLS_ROLE} 127.0.0.1/32 trust # {MARKER}\n{old}"
        );
        std::fs::write(&self.hba_file, new).map_err(|e| format!("{}: {e}", self.hba_file.display()))
    }

    /// Removes what an earlier run left: the marked `pg_hba.conf` lines, the
    /// `ALTER SYSTEM` settings pointing at the marked files, the files.
    fn undo_leftovers(admin_url: &str) -> Result<(), String> {
        let hba_file = PathBuf::from(psql(admin_url, &["SHOW hba_file"])?);
        let hba = std::fs::read_to_string(&hba_file)
            .map_err(|e| format!("{}: {e}", hba_file.display()))?;
        let mut changed = false;
        if hba.contains(MARKER) {
            let kept: String = hba
                .lines()
                .filter(|l| !l.contains(MARKER))
                .map(|l| format!("{l}\n"))
                .collect();
            std::fs::write(&hba_file, kept).map_err(|e| format!("{}: {e}", hba_file.display()))?;
            changed = true;
        }
        let ours = psql(
            admin_url,
            &[&format!(
                "SELECT count(*) FROM pg_file_settings WHERE sourcefile LIKE '%postgresql.auto.conf' AND name IN ('ssl_cert_file', 'ssl_key_file') AND setting LIKE '%{MARKER}%'"
            )],
        )?;
        if ours != "0" {
            psql(
                admin_url,
                &[
                    "ALTER SYSTEM RESET ssl_cert_file",
                    "ALTER SYSTEM RESET ssl_key_file",
                ],
            )?;
            changed = true;
        }
        if changed {
            psql(admin_url, &["SELECT pg_reload_conf()"])?;
            wait_for("PostgreSQL reload", Duration::from_secs(10), || {
                psql(admin_url, &["SHOW ssl_cert_file"]).is_ok_and(|v| !v.contains(MARKER))
            })?;
        }
        let data = PathBuf::from(psql(admin_url, &["SHOW data_directory"])?);
        let _ = std::fs::remove_dir_all(data.join(MARKER));
        Ok(())
    }

    fn restore(&self) -> Result<(), String> {
        let hba = std::fs::read_to_string(&self.hba_file)
            .map_err(|e| format!("{}: {e}", self.hba_file.display()))?;
        let kept: String = hba
            .lines()
            .filter(|l| !l.contains(MARKER))
            .map(|l| format!("{l}\n"))
            .collect();
        std::fs::write(&self.hba_file, kept)
            .map_err(|e| format!("{}: {e}", self.hba_file.display()))?;
        let mut statements = vec![
            "ALTER SYSTEM RESET ssl_cert_file",
            "ALTER SYSTEM RESET ssl_key_file",
        ];
        if self.turned_ssl_on {
            statements.push("ALTER SYSTEM RESET ssl");
        }
        psql(&self.admin_url, &statements)?;
        psql(&self.admin_url, &["SELECT pg_reload_conf()"])?;
        let url = self.admin_url.clone();
        wait_for("PostgreSQL restore", Duration::from_secs(10), || {
            psql(&url, &["SHOW ssl_cert_file"]).is_ok_and(|v| !v.contains(MARKER))
        })?;
        // The role owns nothing; its connections are gone with the test's pools.
        let _ = psql(
            &self.admin_url,
            &[&format!("DROP ROLE IF EXISTS {PG_TLS_ROLE}")],
        );
        let _ = std::fs::remove_dir_all(&self.files);
        Ok(())
    }
}

impl Drop for PgTlsSetup {
    fn drop(&mut self) {
        match self.restore() {
            Ok(()) => eprintln!("tls: PostgreSQL configuration restored"),
            Err(e) => eprintln!("tls: restoring PostgreSQL failed (the next run undoes it): {e}"),
        }
    }
}

// ---------------------------------------------------------------------- Redis

/// Redis listening for TLS on [`REDIS_TLS_PORT`] besides its plain port. Dropping
/// it closes that port and restores the previous `tls-*` settings.
#[derive(Debug)]
pub struct RedisTlsSetup {
    host: String,
    port: String,
    previous: Vec<(&'static str, String)>,
}

const REDIS_TLS_SETTINGS: [&str; 4] = [
    "tls-cert-file",
    "tls-key-file",
    "tls-ca-cert-file",
    "tls-auth-clients",
];

impl RedisTlsSetup {
    /// Switches it on at `host:port` (the plain port of the local server).
    ///
    /// # Errors
    /// What failed; anything already changed is undone.
    pub fn enable(host: &str, port: u16, pki: &TestPki) -> Result<Self, String> {
        let mut setup = Self {
            host: host.to_owned(),
            port: port.to_string(),
            previous: Vec::new(),
        };
        if setup.get("tls-port")? == REDIS_TLS_PORT.to_string() {
            // Left by a crashed run.
            setup.cli(&["CONFIG", "SET", "tls-port", "0"])?;
        }
        for name in REDIS_TLS_SETTINGS {
            let value = setup.get(name)?;
            let value = if value.contains(MARKER) {
                String::new()
            } else {
                value
            };
            setup.previous.push((name, value));
        }
        let s = |p: &Path| p.to_string_lossy().into_owned();
        let (cert, key, ca) = (s(&pki.server_cert), s(&pki.server_key), s(&pki.ca));
        setup.cli(&[
            "CONFIG",
            "SET",
            "tls-cert-file",
            &cert,
            "tls-key-file",
            &key,
            "tls-ca-cert-file",
            &ca,
            "tls-auth-clients",
            "no",
            // In the same command: Redis applies tls-* files only while a TLS port
            // is open, and would otherwise keep the context of an earlier run.
            "tls-port",
            &REDIS_TLS_PORT.to_string(),
        ])?;
        Ok(setup)
    }

    fn cli(&self, args: &[&str]) -> Result<String, String> {
        let mut all = vec!["-h", &self.host, "-p", &self.port];
        all.extend(args);
        let out = output("redis-cli", &all)?;
        if out.starts_with("ERR") || out.starts_with("(error)") {
            return Err(format!("redis-cli {}: {out}", args.join(" ")));
        }
        Ok(out)
    }

    fn get(&self, name: &str) -> Result<String, String> {
        let out = self.cli(&["CONFIG", "GET", name])?;
        Ok(out.lines().nth(1).unwrap_or_default().to_owned())
    }

    fn restore(&self) -> Result<(), String> {
        self.cli(&["CONFIG", "SET", "tls-port", "0"])?;
        let mut args = vec!["CONFIG", "SET"];
        for (name, value) in &self.previous {
            args.extend([*name, value.as_str()]);
        }
        self.cli(&args)?;
        Ok(())
    }
}

impl Drop for RedisTlsSetup {
    fn drop(&mut self) {
        match self.restore() {
            Ok(()) => eprintln!("tls: Redis TLS port closed, settings restored"),
            Err(e) => eprintln!("tls: restoring Redis failed (the next run undoes it): {e}"),
        }
    }
}

// ------------------------------------------------------------------- RabbitMQ

/// An extra TLS listener on `127.0.0.1:`[`RABBIT_TLS_PORT`] of the running broker
/// (the plain listener and its connections are untouched). Dropping it stops that
/// listener.
#[derive(Debug)]
pub struct RabbitTlsSetup {
    _private: (),
}

fn listener() -> String {
    format!("{{\"127.0.0.1\", {RABBIT_TLS_PORT}}}")
}

fn rabbit_eval(expr: &str) -> Result<String, String> {
    output("rabbitmqctl", &["-q", "eval", expr])
}

impl RabbitTlsSetup {
    /// Starts the listener with the test's server certificate. With
    /// `require_client_cert`, a client must present a certificate signed by the
    /// test's CA.
    ///
    /// # Errors
    /// What failed.
    pub fn enable(pki: &TestPki, require_client_cert: bool) -> Result<Self, String> {
        // A listener left by a crashed run; none is the usual answer.
        let _ = rabbit_eval(&format!(
            "catch rabbit_networking:stop_tcp_listener({}).",
            listener()
        ));
        let s = |p: &Path| p.to_string_lossy().into_owned();
        let verify = if require_client_cert {
            "{verify, verify_peer}, {fail_if_no_peer_cert, true}"
        } else {
            "{verify, verify_none}, {fail_if_no_peer_cert, false}"
        };
        let expr = format!(
            "rabbit_networking:start_ssl_listener({}, [{{cacertfile, \"{}\"}}, {{certfile, \"{}\"}}, {{keyfile, \"{}\"}}, {verify}], 1).",
            listener(),
            s(&pki.ca),
            s(&pki.server_cert),
            s(&pki.server_key)
        );
        let out = rabbit_eval(&expr)?;
        if out != "ok" {
            return Err(format!("rabbit_networking:start_ssl_listener: {out}"));
        }
        let addr = format!("127.0.0.1:{RABBIT_TLS_PORT}");
        wait_for("RabbitMQ TLS listener", Duration::from_secs(10), || {
            crate::services::answering(&addr)
        })?;
        Ok(Self { _private: () })
    }
}

impl Drop for RabbitTlsSetup {
    fn drop(&mut self) {
        match rabbit_eval(&format!(
            "rabbit_networking:stop_tcp_listener({}).",
            listener()
        )) {
            Ok(_) => eprintln!("tls: RabbitMQ TLS listener stopped"),
            Err(e) => {
                eprintln!("tls: stopping the RabbitMQ TLS listener failed (the next run does): {e}")
            }
        }
    }
}
