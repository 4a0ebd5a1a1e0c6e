"""Running a parts folder: its manifest read as untrusted input (``manifest``), the
threaded runner that verifies and measures it beside what users run (``runner``), the
check (``verify``), Ray's actors (``ray_engine``) and the HTTP server (``serve``,
``kserve``)."""
