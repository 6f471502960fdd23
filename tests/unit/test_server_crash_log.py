"""ragstack.fatal_signal: Triton's line for a crash, and the ones a server log gains (each reported once);
tests/server_crash.py: the aborting threads picked from gdb's stacks."""
from ragstack.fatal_signal import LogWatch, fatal_signal
from server_crash import aborting_threads


def test_a_crash_is_told_from_a_stop():
    assert fatal_signal(b"Signal (11) received.\n") == 11
    assert fatal_signal(b"Signal (6) received.") == 6
    assert fatal_signal(b"Signal (2) received.\n") is None and fatal_signal(b"Signal (15) received.") is None
    assert fatal_signal(b"I1206 model: Signal (11) received.") is None  # only Triton's own line, at its start


def test_fatal_lines_are_reported_once_and_a_cut_line_is_read_again(tmp_path):
    log = tmp_path / "tritonserver.log"
    watch = LogWatch(log)
    assert watch.new_fatal_lines() == []  # no log yet
    log.write_bytes(b"I1205 model ready\nSignal (6) rec")
    assert watch.new_fatal_lines() == []
    with open(log, "ab") as f:
        f.write(b"eived.\n 0# 0x000 in tritonserver\nSignal (2) received.\nSignal (11) received.\n")
    assert watch.new_fatal_lines() == ["Signal (6) received.", "Signal (11) received."]
    assert watch.new_fatal_lines() == []


def test_the_aborting_threads_are_picked_from_gdb_output():
    output = ("Thread 3 (Thread 0x7f (LWP 12) \"tritonserver\"):\n#0  0x1 in epoll_wait ()\n"
              "Thread 2 (Thread 0x7e (LWP 11) \"tritonserver\"):\n#0  0x2 in __pthread_kill_implementation ()\n"
              "#1  0x3 in raise ()\n#2  0x4 in abort ()\n#3  0x5 in malloc_printerr ()\n#4  0x6 in _int_free ()\n"
              "Thread 1 (Thread 0x7d (LWP 10) \"tritonserver\"):\n#0  0x7 in pthread_cond_wait ()\n")
    (thread,) = aborting_threads(output)
    assert thread.startswith("Thread 2 ") and "_int_free" in thread
