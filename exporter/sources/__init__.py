"""Sources: the edges that turn files, stdin and HTTP bodies into bytes and samples."""
