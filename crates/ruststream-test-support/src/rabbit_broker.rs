//! A rabbitmq-server of a test's own (Debian's `rabbitmq-server`, installed by the test
//! command), on free ports and a directory of its own, to be SIGKILLed and started again:
//! for the broker-restart tests.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::free_port;

/// A broker process on its own ports and directories, killed on drop.
pub struct OwnRabbit {
    /// The wrapper scripts started, reaped once killed.
    wrappers: Mutex<Vec<std::process::Child>>,
    port: u16,
    dist: u16,
    node: String,
    base: PathBuf,
}

impl OwnRabbit {
    /// A broker on free ports, in a directory of its own; not started yet.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        let suffix = crate::unique_suffix();
        let base = std::env::temp_dir().join(format!("rabbit-restart-{suffix}"));
        Self {
            wrappers: Mutex::default(),
            port: free_port(),
            dist: free_port(),
            node: format!("rs-restart-{}@localhost", suffix.replace(['-', '.'], "")),
            base,
        }
    }

    /// Starts it (again) and waits until it takes connections.
    pub async fn start(&self) {
        for dir in ["home", "mnesia", "log"] {
            std::fs::create_dir_all(self.base.join(dir)).expect("broker directories");
        }
        std::fs::write(self.base.join("enabled_plugins"), "[].").expect("plugins file");
        // Debian's wrapper switches to the rabbitmq user when run as root.
        let _ = std::process::Command::new("chown")
            .args(["-R", "rabbitmq:rabbitmq"])
            .arg(&self.base)
            .status();
        let binary = "rabbitmq-server";
        let wrapper = std::process::Command::new(binary)
            .env("HOME", self.base.join("home"))
            .env("RABBITMQ_NODENAME", &self.node)
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist.to_string())
            .env("RABBITMQ_MNESIA_BASE", self.base.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", self.base.join("log"))
            .env(
                "RABBITMQ_ENABLED_PLUGINS_FILE",
                self.base.join("enabled_plugins"),
            )
            .env("ERL_EPMD_ADDRESS", "127.0.0.1")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {binary} (the test command installs it): {e}"));
        self.wrappers.lock().unwrap().push(wrapper);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !speaks_amqp(self.port).await {
            assert!(Instant::now() < deadline, "rabbitmq-server did not come up");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops and starts the broker's application gracefully (`rabbitmqctl stop_app`,
    /// `start_app`), closing every connection, and waits until it takes connections again.
    ///
    /// For quorum queues declared moments ago: RabbitMQ 3.10 keeps which Ra server belongs
    /// to which quorum queue in a dets table written to disk every 3 minutes or at a clean
    /// stop, so a SIGKILL within 3 minutes of declaring a quorum queue loses that entry and
    /// the queue comes back with an empty, leaderless Ra server (log index 0, term 0: it
    /// refuses every consumer and nacks every publish, for good). A queue older than 3
    /// minutes, or one the broker has stopped cleanly since, survives the SIGKILL.
    pub async fn restart_gracefully(&self) {
        for step in ["stop_app", "start_app"] {
            let status = std::process::Command::new("rabbitmqctl")
                .env("HOME", self.base.join("home"))
                .args(["-n", &self.node, step])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .unwrap_or_else(|e| panic!("running rabbitmqctl {step}: {e}"));
            assert!(status.success(), "rabbitmqctl {step} failed: {status}");
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while !speaks_amqp(self.port).await {
            assert!(
                Instant::now() < deadline,
                "rabbitmq-server did not come back"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Sends `signal` to every process of this node (the Erlang VM and its wrapper).
    fn signal(&self, signal: &str) {
        let wanted = format!("RABBITMQ_NODENAME={}", self.node);
        for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
            let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
                continue;
            };
            if environ
                .split(|b| *b == 0)
                .any(|var| var == wanted.as_bytes())
            {
                let _ = std::process::Command::new("kill")
                    .arg(signal)
                    .arg(entry.file_name())
                    .status();
            }
        }
    }

    /// Stops the broker answering (SIGSTOP): connections stay open, nothing on them is
    /// read or answered, and new ones are not accepted.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Lets a frozen broker go on (SIGCONT).
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    /// SIGKILLs every process of this node (the Erlang VM and its wrapper).
    pub fn kill(&self) {
        self.signal("-9");
        for mut wrapper in self.wrappers.lock().unwrap().drain(..) {
            let _ = wrapper.kill();
            let _ = wrapper.wait();
        }
    }

    /// The AMQP URL (guest credentials, the default virtual host).
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }
}

impl Drop for OwnRabbit {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

/// Whether something on `port` answers the AMQP 0-9-1 protocol header with a method frame
/// (`connection.start`): the broker takes connections, not just its port.
pub async fn speaks_amqp(port: u16) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let greeting = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream.write_all(b"AMQP\x00\x00\x09\x01").await?;
        let mut frame_type = [0_u8; 1];
        stream.read_exact(&mut frame_type).await?;
        Ok::<_, std::io::Error>(frame_type[0] == 1)
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(2), greeting).await,
        Ok(Ok(true))
    )
}
