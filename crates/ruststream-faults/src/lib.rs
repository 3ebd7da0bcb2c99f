//! Fault tests for ruststream: the services under test run as separate processes
//! (`src/bin`), so a test can kill them with SIGKILL and start them again.
