"""The `run` face: `mpdoctor run -- CMD` runs a command as if bare and diagnoses it.

The wrapper, one idea a module:
- wrapper.py: the two modes (pipes, pty) and run_command, which ties the rest together;
- spawn.py: starting the command with execvp's semantics, and the child's set-up
  between fork and exec (its process group, its death with the wrapper);
- lifeline.py: the process that kills the child's group if the wrapper dies, and tells a
  signal sent to the whole job from one sent to the wrapper;
- forward.py: signals forwarded to the child's group, job control;
- terminal.py: the terminal's foreground group, the child's ptys, Ctrl-Z on a pty;
- streams.py: what each standard stream is, and files the child wrote read back;
- pump.py: the byte-for-byte copy of the child's output (and keystrokes);
- tail.py: the bounded head and tail of the output kept for the diagnosis;
- inject.py: the instrumentation's private folder and the child's environment.
The diagnosis: evidence.py (the run's evidence), checks/ (the run rules' checks,
one module per kind of question). Judged by the rule base in mpdoctor/diagnosis/run.py. Nothing here imports torch, and this
file imports nothing, so that `mpdoctor run` loads only what it uses.
"""
