"""Reports and views of a run: the terminal summary, JSON and JUnit (`report`), the HTML trace
view (`html_view`), what `kvsched replay` prints (`replay_view`) and one step's decisions in words
(`explain`)."""
