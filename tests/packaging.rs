//! How outbox-poll is set up and deployed: the set-up script behind
//! scripts/test.sh and scripts/demo.sh, and what deploy/ ships (the systemd
//! units, the environment file, the Kubernetes CronJob). The Debian package
//! itself takes a release build, so scripts/deb.sh builds and checks it,
//! outside cargo test.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use crate::common::scratch::Scratch;
use yaml_rust2::{Yaml, YamlLoader};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path))
        .unwrap_or_else(|error| panic!("reading {path}: {error}"))
}

// The set-up script, on a fresh machine.

/// A fresh machine for scripts/setup.sh: a HOME of its own with no Rust in
/// it, a PATH with no cargo, and fake commands in front that log how they
/// were called (to HOME/calls.log) instead of downloading or starting
/// anything. The servers are left out (as TEST_DATABASE_URL /
/// TEST_AMQP_URL do) unless a test fakes them.
struct FreshMachine {
    home: Scratch,
    env: Vec<(&'static str, &'static str)>,
}

/// curl that "downloads" what rustup's installer does, as far as the
/// scripts can tell: a cargo in ~/.cargo/bin and the env file that puts it
/// on PATH. That cargo logs its commands and passes.
const CURL_OF_A_FAKE_RUSTUP: &str = r#"cat <<'INSTALLER'
mkdir -p "$HOME/.cargo/bin"
cat >"$HOME/.cargo/bin/cargo" <<'CARGO'
#!/bin/sh
if [ "$1" = --version ]; then echo "cargo 99.0.0"; exit 0; fi
echo cargo "$*" >>"$HOME/calls.log"
CARGO
chmod +x "$HOME/.cargo/bin/cargo"
echo 'export PATH="$HOME/.cargo/bin:$PATH"' >"$HOME/.cargo/env"
INSTALLER"#;

/// curl that cannot reach rustup's script host but can reach the
/// toolchain's: the rustup-init it saves (to curl's -o) installs the same
/// fake Rust as CURL_OF_A_FAKE_RUSTUP.
const CURL_OF_THE_TOOLCHAIN_HOST_ONLY: &str = r#"case "$*" in
*sh.rustup.rs*) echo "curl: (6) Could not resolve host: sh.rustup.rs" >&2; exit 6 ;;
esac
while [ "$1" != -o ]; do shift; done
cat >"$2" <<'INIT'
#!/bin/sh
mkdir -p "$HOME/.cargo/bin"
printf '#!/bin/sh\nif [ "$1" = --version ]; then echo "cargo 99.0.0"; exit 0; fi\necho cargo "$*" >>"$HOME/calls.log"\n' >"$HOME/.cargo/bin/cargo"
chmod +x "$HOME/.cargo/bin/cargo"
echo 'export PATH="$HOME/.cargo/bin:$PATH"' >"$HOME/.cargo/env"
INIT"#;

/// curl when the download fails, as it says so.
const FAILING_CURL: &str = r#"echo "curl: (6) Could not resolve host: sh.rustup.rs" >&2; exit 6"#;

impl FreshMachine {
    fn new(test: &str) -> FreshMachine {
        FreshMachine {
            home: Scratch::new(test),
            env: vec![
                ("TEST_DATABASE_URL", "postgresql://elsewhere/test"),
                ("TEST_AMQP_URL", "amqp://elsewhere"),
            ],
        }
    }

    /// A command of the machine's, in front of the real ones: it logs its
    /// name and arguments, then runs `body`.
    fn fake(&self, name: &str, body: &str) {
        let script = format!("#!/bin/sh\necho {name} \"$*\" >>\"$HOME/calls.log\"\n{body}\n");
        let path = self.home.path().join("bin").join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// Local PostgreSQL servers that are up (for the set-up script's
    /// checks, which are all it runs then).
    fn with_local_postgres(mut self) -> FreshMachine {
        self.env.retain(|(name, _)| *name != "TEST_DATABASE_URL");
        self.fake("pg_isready", "exit 0");
        self.fake("psql", "echo 1");
        self
    }

    /// rustup's download works, and installs a Rust whose cargo logs its
    /// commands.
    fn with_rust_download(self) -> FreshMachine {
        self.fake("curl", CURL_OF_A_FAKE_RUSTUP);
        self
    }

    /// The rustup script's host is blocked; the toolchain's host is not.
    fn with_only_the_toolchain_host(self) -> FreshMachine {
        self.fake("curl", CURL_OF_THE_TOOLCHAIN_HOST_ONLY);
        self
    }

    fn with_failing_rust_download(self) -> FreshMachine {
        self.fake("curl", FAILING_CURL);
        self
    }

    /// Runs a script that must succeed; its stdout.
    fn run_ok(&self, script: &str) -> String {
        let output = self.run(script);
        assert!(
            output.status.success(),
            "{script}: {}",
            text(&output.stderr)
        );
        text(&output.stdout)
    }

    fn run(&self, script: &str) -> Output {
        let home = self.home.path();
        let path = format!(
            "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            home.join("bin").display()
        );
        Command::new(repo().join(script))
            .env_clear()
            .env("HOME", home)
            .env("PATH", path)
            .envs(self.env.iter().copied())
            .output()
            .unwrap()
    }

    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.home.path().join("calls.log"))
            .unwrap_or_default()
            .lines()
            .map(String::from)
            .collect()
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn setup_without_a_rust_download_still_sets_up_the_servers_and_says_what_to_do() {
    let machine = FreshMachine::new("setup-no-download")
        .with_local_postgres()
        .with_failing_rust_download();
    let output = machine.run("scripts/setup.sh");
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        machine.calls().iter().any(|call| call.starts_with("psql")),
        "PostgreSQL was not checked: {:?}",
        machine.calls()
    );
    assert_eq!(
        stderr.lines().last(),
        Some(
            "setup: could not install Rust with rustup (see the lines above): install Rust 1.88 \
             or later from https://rustup.rs, check that `cargo --version` works, then run \
             this again"
        ),
        "{stderr}"
    );
    assert!(!text(&output.stdout).contains("Rust is in"));
}

#[test]
fn setup_fetches_rustup_init_from_the_toolchain_host_when_the_rustup_script_cannot_be() {
    let machine = FreshMachine::new("setup-direct-init")
        .with_local_postgres()
        .with_only_the_toolchain_host();
    let stdout = machine.run_ok("scripts/setup.sh");
    assert!(
        stdout.contains("trying rustup-init from static.rust-lang.org"),
        "{stdout}"
    );
    assert!(
        stdout.contains("setup: Rust is in ~/.cargo/bin"),
        "{stdout}"
    );
    let downloads: Vec<String> = machine
        .calls()
        .into_iter()
        .filter(|call| call.starts_with("curl"))
        .collect();
    assert_eq!(downloads.len(), 2, "{downloads:?}");
    assert!(
        downloads[1].contains("https://static.rust-lang.org/rustup/dist/"),
        "{downloads:?}"
    );
}

#[test]
fn setup_that_installs_rust_says_how_to_put_it_on_path() {
    let machine = FreshMachine::new("setup-installs").with_rust_download();
    let stdout = machine.run_ok("scripts/setup.sh");
    assert!(
        stdout.contains(
            "setup: Rust is in ~/.cargo/bin: to use cargo in this shell, run . \"$HOME/.cargo/env\""
        ),
        "{stdout}"
    );
}

#[test]
fn setup_finds_an_installed_rust_off_path_and_says_nothing() {
    let machine = FreshMachine::new("setup-off-path").with_rust_download();
    // Rust installed by an earlier run, in a shell that has not sourced it.
    machine.run_ok("scripts/setup.sh");
    assert_eq!(machine.run_ok("scripts/setup.sh"), "");
    let downloads = machine
        .calls()
        .iter()
        .filter(|call| call.starts_with("curl"))
        .count();
    assert_eq!(downloads, 1, "the second run downloaded Rust again");
}

#[test]
fn the_test_script_runs_the_checks_with_the_rust_its_setup_just_installed() {
    let machine = FreshMachine::new("test-script").with_rust_download();
    machine.run_ok("scripts/test.sh");
    let cargo: Vec<String> = machine
        .calls()
        .into_iter()
        .filter(|call| call.starts_with("cargo"))
        .collect();
    let home = machine.home.path().display();
    assert_eq!(
        cargo,
        [
            format!(
                "cargo install --locked --quiet --target-dir {home}/.cache/outbox-poll/cargo-deny-build cargo-deny"
            ),
            "cargo fmt --check".into(),
            "cargo clippy --all-targets --locked -- -D warnings".into(),
            "cargo test".into()
        ]
    );
}

#[test]
fn the_test_script_says_why_it_skips_a_guard_rail_whose_tool_is_missing() {
    // The fresh machine's Rust has no rustup and its cargo builds no
    // cargo-deny: the MSRV check and cargo deny are skipped, each saying so.
    let machine = FreshMachine::new("test-script-skips").with_rust_download();
    let stdout = machine.run_ok("scripts/test.sh");
    for skipped in [
        "==> skipped: the MSRV check (cargo +1.88 check), no Rust 1.88 toolchain",
        "==> skipped: cargo deny, not installed",
    ] {
        assert!(
            stdout.lines().any(|line| line.starts_with(skipped)),
            "no line starting {skipped:?}:\n{stdout}"
        );
    }
    assert!(
        stdout.contains("setup: cargo-deny is not installed yet"),
        "{stdout}"
    );
}

// The systemd units.

/// deploy/systemd as systemd-analyze checks it, or None (with a line on
/// stderr) where systemd-analyze is not installed: copies whose ExecStart
/// names the binary under test, since `verify` checks that the command
/// exists and /usr/bin/outbox-poll is the package's.
fn systemd_units(test: &str) -> Option<Scratch> {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: systemd-analyze is not installed (apt install systemd)");
        return None;
    }
    let dir = Scratch::new(test);
    for entry in std::fs::read_dir(repo().join("deploy/systemd")).unwrap() {
        let path = entry.unwrap().path();
        let unit = std::fs::read_to_string(&path)
            .unwrap()
            .replace("/usr/bin/outbox-poll", crate::common::BIN);
        std::fs::write(dir.path().join(path.file_name().unwrap()), unit).unwrap();
    }
    Some(dir)
}

fn unit_paths(dir: &Scratch, suffix: &str) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.to_str().unwrap().ends_with(suffix))
        .collect();
    paths.sort();
    paths
}

#[test]
fn the_systemd_units_pass_systemd_analyze_verify() {
    let Some(units) = systemd_units("verify") else {
        return;
    };
    let output = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .args(unit_paths(&units, ""))
        .output()
        .unwrap();
    // verify exits 0 on an unknown key or a value it cannot parse, and says
    // so: any word from it is a failure.
    let said = format!("{}{}", text(&output.stdout), text(&output.stderr));
    assert!(output.status.success() && said.is_empty(), "{said}");
    assert_eq!(unit_paths(&units, "").len(), 4, "two services, two timers");
}

#[test]
fn the_services_are_hardened_to_an_exposure_of_at_most_1_2() {
    let Some(units) = systemd_units("security") else {
        return;
    };
    let help = Command::new("systemd-analyze")
        .arg("--help")
        .output()
        .unwrap();
    if !text(&help.stdout).contains("--offline") {
        eprintln!("skipped: this systemd-analyze has no security --offline (systemd 250 or later)");
        return;
    }
    let services = unit_paths(&units, ".service");
    assert_eq!(services.len(), 2);
    for service in services {
        let output = Command::new("systemd-analyze")
            .args(["security", "--offline=true", "--threshold=12", "--no-pager"])
            .arg(&service)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}: {}{}",
            service.display(),
            text(&output.stdout),
            text(&output.stderr)
        );
    }
}

/// Every value of `key` in the [Service] section of a unit of deploy/systemd.
fn unit_values(unit: &str, key: &str) -> Vec<String> {
    read(&format!("deploy/systemd/{unit}"))
        .lines()
        .filter_map(|line| line.strip_prefix(&format!("{key}=")))
        .map(String::from)
        .collect()
}

const SERVICES: [&str; 2] = ["outbox-poll.service", "outbox-poll-follow.service"];

#[test]
fn a_stopped_run_succeeds_and_any_other_nonzero_exit_fails_the_unit() {
    for service in SERVICES {
        assert_eq!(
            unit_values(service, "SuccessExitStatus"),
            ["130 143"],
            "{service}: SIGINT and SIGTERM only, so that 1, 69 and 78 show as failures"
        );
    }
}

#[test]
fn a_stop_waits_for_every_batch_in_hand() {
    // The README's budget of one batch step with the default timeouts
    // (2 x 10 s connect + 30 s confirm + 30 s + 5 s), times the batches a
    // run keeps in flight: one for a single batch, up to 4 for a drain.
    let step = Duration::from_secs(85);
    for (service, batches) in [
        ("outbox-poll.service", 1),
        ("outbox-poll-follow.service", 4),
    ] {
        let timeout = unit_values(service, "TimeoutStopSec");
        let timeout = humantime::parse_duration(&timeout[0]).unwrap();
        assert!(timeout >= step * batches, "{service}: {timeout:?}");
    }
}

#[test]
fn every_command_line_the_deploy_files_run_is_one_the_binary_accepts() {
    let mut lines: Vec<Vec<String>> = SERVICES
        .iter()
        .map(|service| {
            let exec = &unit_values(service, "ExecStart")[0];
            exec.split_whitespace().skip(1).map(String::from).collect()
        })
        .collect();
    let (cronjob, _) = cronjob();
    lines.push(args_of(container(&cronjob)));
    lines.extend(indexed_job_lines());
    for args in lines {
        // clap refuses an unknown option before it reads --help.
        let run = Command::new(crate::common::BIN)
            .args(&args)
            .arg("--help")
            .output()
            .unwrap();
        assert!(run.status.success(), "{args:?}: {}", text(&run.stderr));
    }
}

#[test]
fn no_deploy_file_gives_a_url_on_the_command_line() {
    for path in [
        "crontab.example",
        "Dockerfile",
        "deploy/kubernetes/cronjob.yaml",
        "deploy/kubernetes/indexed-job.yaml",
        "deploy/systemd/outbox-poll.service",
        "deploy/systemd/outbox-poll-follow.service",
    ] {
        let text = read(path);
        for flag in ["--database-url", "--amqp-url"] {
            assert!(
                !text.contains(flag),
                "{path} gives {flag}: use the file or the environment"
            );
        }
    }
    let (cronjob, _) = cronjob();
    let env = container(&cronjob)["env"]
        .as_vec()
        .expect("the CronJob's env");
    let names: Vec<&str> = env
        .iter()
        .map(|var| var["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["DATABASE_URL_FILE", "AMQP_URL_FILE"]);
}

// The example environment file.

#[test]
fn the_example_environment_file_names_only_variables_outbox_poll_reads() {
    let help = Command::new(crate::common::BIN)
        .arg("--help")
        .output()
        .unwrap();
    let help = text(&help.stdout);
    let env = read("deploy/outbox-poll.env");
    let names: Vec<&str> = env
        .lines()
        .map(|line| line.trim_start_matches('#'))
        .filter_map(|line| line.split_once('='))
        .map(|(name, _)| name)
        .filter(|name| !name.contains(' '))
        .collect();
    assert!(names.contains(&"DATABASE_URL") && names.contains(&"AMQP_URL"));
    for name in names {
        // PG* variables are libpq's, read by the PostgreSQL connection.
        // A URL's _FILE variable is named in its option's help.
        let file_variable = name.ends_with("_FILE") && help.contains(name);
        assert!(
            name.starts_with("PG") || file_variable || help.contains(&format!("[env: {name}")),
            "{name} is not a variable of outbox-poll --help"
        );
    }
}

// The Kubernetes CronJob.

/// deploy/kubernetes/cronjob.yaml: its one document and its text.
fn cronjob() -> (Yaml, String) {
    manifest("deploy/kubernetes/cronjob.yaml")
}

/// deploy/kubernetes/indexed-job.yaml, a CronJob of Indexed Jobs.
fn indexed_job() -> (Yaml, String) {
    manifest("deploy/kubernetes/indexed-job.yaml")
}

/// A manifest's one document and its text.
fn manifest(path: &str) -> (Yaml, String) {
    let text = read(path);
    let mut documents =
        YamlLoader::load_from_str(&text).unwrap_or_else(|e| panic!("{path} is not YAML: {e}"));
    assert_eq!(documents.len(), 1, "{path}");
    (documents.remove(0), text)
}

/// A container's args, as strings.
fn args_of(container: &Yaml) -> Vec<String> {
    container["args"]
        .as_vec()
        .expect("the container's args")
        .iter()
        .map(|arg| arg.as_str().unwrap().to_string())
        .collect()
}

/// The args of each pod of the indexed Job, `$(JOB_COMPLETION_INDEX)`
/// expanded as Kubernetes expands it: one line per completion index.
fn indexed_job_lines() -> Vec<Vec<String>> {
    let (job_spec, _) = indexed_job();
    let completions = job(&job_spec)["completions"].as_i64().expect("completions");
    let args = args_of(container(&job_spec));
    (0..completions)
        .map(|index| {
            args.iter()
                .map(|arg| arg.replace("$(JOB_COMPLETION_INDEX)", &index.to_string()))
                .collect()
        })
        .collect()
}

fn job(cronjob: &Yaml) -> &Yaml {
    &cronjob["spec"]["jobTemplate"]["spec"]
}

fn pod(cronjob: &Yaml) -> &Yaml {
    &job(cronjob)["template"]["spec"]
}

fn container(cronjob: &Yaml) -> &Yaml {
    let containers = pod(cronjob)["containers"].as_vec().expect("containers");
    assert_eq!(containers.len(), 1);
    &containers[0]
}

#[test]
fn the_cronjob_allows_overlapping_runs_and_says_why() {
    let (cronjob, text) = cronjob();
    assert_eq!(cronjob["apiVersion"].as_str(), Some("batch/v1"));
    assert_eq!(cronjob["kind"].as_str(), Some("CronJob"));
    assert_eq!(cronjob["spec"]["concurrencyPolicy"].as_str(), Some("Allow"));
    let reason = text.split("concurrencyPolicy").next().unwrap();
    let reason = reason.rsplit("\n  schedule").next().unwrap();
    assert!(reason.contains("SKIP LOCKED"), "{reason}");
}

#[test]
fn a_failed_cronjob_run_is_not_retried_and_every_run_has_a_deadline() {
    let (cronjob, _) = cronjob();
    assert_eq!(job(&cronjob)["backoffLimit"].as_i64(), Some(0));
    assert_eq!(pod(&cronjob)["restartPolicy"].as_str(), Some("Never"));
    let deadline = job(&cronjob)["activeDeadlineSeconds"]
        .as_i64()
        .expect("activeDeadlineSeconds");
    // Past --max-duration (50 s) and the batch step's budget (85 s).
    assert!(deadline > 50 + 85, "{deadline}");
}

#[test]
fn the_cronjob_reads_both_urls_from_a_mounted_secret() {
    let (cronjob, _) = cronjob();
    let container = container(&cronjob);
    let env = container["env"].as_vec().expect("env");
    let mount = container["volumeMounts"].as_vec().expect("volumeMounts");
    let volumes = pod(&cronjob)["volumes"].as_vec().expect("volumes");
    for name in ["DATABASE_URL_FILE", "AMQP_URL_FILE"] {
        let variable = env
            .iter()
            .find(|variable| variable["name"].as_str() == Some(name))
            .unwrap_or_else(|| panic!("no {name}"));
        let path = variable["value"].as_str().expect("a path");
        let mounted = mount
            .iter()
            .find(|mount| path.starts_with(mount["mountPath"].as_str().unwrap()))
            .unwrap_or_else(|| panic!("{name}: {path} is on no volume"));
        let volume = volumes
            .iter()
            .find(|volume| volume["name"] == mounted["name"])
            .expect("the mount's volume");
        assert!(
            volume["secret"]["secretName"].as_str().is_some(),
            "{name} is not from a Secret"
        );
    }
    // The pod's user reads the Secret's files through its group.
    assert_eq!(
        pod(&cronjob)["securityContext"]["fsGroup"],
        pod(&cronjob)["securityContext"]["runAsGroup"]
    );
}

#[test]
fn the_cronjob_runs_as_non_root_on_a_read_only_root_file_system() {
    let (cronjob, _) = cronjob();
    assert_eq!(
        pod(&cronjob)["securityContext"]["runAsNonRoot"].as_bool(),
        Some(true)
    );
    let security = &container(&cronjob)["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"].as_bool(), Some(true));
    assert_eq!(security["allowPrivilegeEscalation"].as_bool(), Some(false));
    assert_eq!(
        security["capabilities"]["drop"][0].as_str(),
        Some("ALL"),
        "every capability dropped"
    );
}

#[test]
fn the_cronjob_sets_resources_and_a_grace_period_for_the_batches_in_hand() {
    let (cronjob, _) = cronjob();
    let resources = &container(&cronjob)["resources"];
    assert!(resources["requests"]["cpu"].as_str().is_some());
    assert!(resources["requests"]["memory"].as_str().is_some());
    assert!(resources["limits"]["memory"].as_str().is_some());
    // Its --batch-size 1000 drain keeps 2 batches in flight, 85 s a step.
    let grace = pod(&cronjob)["terminationGracePeriodSeconds"].as_i64();
    assert!(grace >= Some(2 * 85), "{grace:?}");
}

#[test]
fn the_cronjob_explains_each_exit_code_for_alerts() {
    let (_, text) = cronjob();
    explains_each_exit_code(&text);
}

// The Kubernetes CronJob of Indexed Jobs, one shard a pod.

#[test]
fn the_indexed_job_runs_one_shard_per_completion_index_and_every_shard_once() {
    let (job_spec, text) = indexed_job();
    assert_eq!(job_spec["kind"].as_str(), Some("CronJob"));
    let spec = job(&job_spec);
    assert_eq!(spec["completionMode"].as_str(), Some("Indexed"));
    let completions = spec["completions"].as_i64().expect("completions");
    assert!(completions > 1, "{completions}");
    assert_eq!(spec["parallelism"].as_i64(), Some(completions));
    let args = args_of(container(&job_spec));
    let shard = args
        .iter()
        .position(|arg| arg == "--shard")
        .map(|at| args[at + 1].as_str());
    let expected = format!("$(JOB_COMPLETION_INDEX)/{completions}");
    assert_eq!(shard, Some(expected.as_str()), "{args:?}");
    // Kubernetes expands $(NAME) in args only from the container's env.
    let env = container(&job_spec)["env"].as_vec().expect("env");
    let index = env
        .iter()
        .find(|var| var["name"].as_str() == Some("JOB_COMPLETION_INDEX"))
        .expect("JOB_COMPLETION_INDEX in env");
    assert_eq!(
        index["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
        Some("metadata.annotations['batch.kubernetes.io/job-completion-index']")
    );
    assert!(text.contains("SKIP LOCKED"));
}

#[test]
fn the_indexed_job_shards_past_the_last_index_are_refused_with_2() {
    // One more index than completions: the binary says the shard is
    // outside 0..N-1, so a manifest whose N and completions disagree the
    // other way round cannot pass unseen either.
    let lines = indexed_job_lines();
    let last = lines.last().unwrap();
    let over = last
        .iter()
        .map(|arg| {
            let Some((index, count)) = arg.split_once('/') else {
                return arg.clone();
            };
            match (index.parse::<u32>(), count.parse::<u32>()) {
                (Ok(index), Ok(count)) => format!("{}/{count}", index + 1),
                _ => arg.clone(),
            }
        })
        .collect::<Vec<_>>();
    let run = Command::new(crate::common::BIN)
        .args(&over)
        .arg("--help")
        .output()
        .unwrap();
    assert_eq!(
        run.status.code(),
        Some(2),
        "{over:?}: {}",
        text(&run.stderr)
    );
}

#[test]
fn the_indexed_job_keeps_the_cronjobs_safety_settings() {
    let (job_spec, text) = indexed_job();
    let spec = job(&job_spec);
    // One shard's failure must not end the other shards' pods.
    assert_eq!(spec["backoffLimitPerIndex"].as_i64(), Some(0));
    assert!(
        spec["backoffLimit"].is_badvalue(),
        "backoffLimit ends every index"
    );
    assert_eq!(pod(&job_spec)["restartPolicy"].as_str(), Some("Never"));
    assert!(spec["activeDeadlineSeconds"].as_i64() > Some(50 + 85));
    assert!(pod(&job_spec)["terminationGracePeriodSeconds"].as_i64() >= Some(2 * 85));
    assert_eq!(
        pod(&job_spec)["securityContext"]["runAsNonRoot"].as_bool(),
        Some(true)
    );
    let security = &container(&job_spec)["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"].as_bool(), Some(true));
    let env = container(&job_spec)["env"].as_vec().expect("env");
    let names: Vec<&str> = env.iter().map(|v| v["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["JOB_COMPLETION_INDEX", "DATABASE_URL_FILE", "AMQP_URL_FILE"]
    );
    explains_each_exit_code(&text);
}

/// A comment line of `text` starts with each exit code.
fn explains_each_exit_code(text: &str) {
    for code in ["0", "1", "2", "69", "78", "130, 143"] {
        assert!(
            text.lines().any(|line| line
                .strip_prefix('#')
                .is_some_and(|comment| comment.trim_start().starts_with(&format!("{code} ")))),
            "no comment line explains exit code {code}"
        );
    }
}
