"""The engines that run ranks (local processes, torch's elastic launcher, Ray Train) behind one interface."""
