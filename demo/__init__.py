"""`make demo`: runs what Parallax has today and says plainly what it shows."""
