"""``ftcomm-run``: starts an MPI job with fault tolerance on (``run``), builds the launcher's
command line (``command``) and reads the ranks' exit reports (``reports``). It needs no
communicator: it only reads ``ftcomm.settings``."""
