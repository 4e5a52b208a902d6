-- A store written by tx at a55a28d (before migrations), by Store.from_url and its writes.
CREATE TABLE checkpoints (
	run_id VARCHAR(128) NOT NULL, 
	checkpoint_id VARCHAR(300) NOT NULL, 
	kind VARCHAR(32) NOT NULL, 
	owner VARCHAR(64) NOT NULL, 
	size_bytes BIGINT NOT NULL, 
	created_at DATETIME NOT NULL, 
	expires_at DATETIME, 
	user_metadata JSON, 
	public BOOLEAN NOT NULL, 
	PRIMARY KEY (run_id, checkpoint_id), 
	FOREIGN KEY(run_id) REFERENCES training_runs (run_id)
);
INSERT INTO "checkpoints" VALUES('s1:train:0','weights/step-1','weights','tml-alice',1234,'2026-11-24 09:30:00.000000','2027-12-29 09:30:00.000000','null',1);
INSERT INTO "checkpoints" VALUES('s1:train:0','sampler_weights/s1','sampler_weights','tml-alice',99,'2026-11-24 09:30:00.000000',NULL,NULL,0);
CREATE TABLE sampling_sessions (
	sampling_session_id VARCHAR(160) NOT NULL, 
	session_id VARCHAR(64) NOT NULL, 
	owner VARCHAR(64) NOT NULL, 
	base_model VARCHAR(256) NOT NULL, 
	model_path VARCHAR(512), 
	run_id VARCHAR(128), 
	weights_dir VARCHAR(1024), 
	created_at DATETIME NOT NULL, 
	PRIMARY KEY (sampling_session_id), 
	FOREIGN KEY(session_id) REFERENCES sessions (session_id)
);
INSERT INTO "sampling_sessions" VALUES('s1:sample:0','s1','tml-alice','tiny-qwen3','tinker://s1:train:0/sampler_weights/s1','s1:train:0','/data/checkpoints/x','2026-11-24 09:30:00.000000');
CREATE TABLE sessions (
	session_id VARCHAR(64) NOT NULL, 
	owner VARCHAR(64) NOT NULL, 
	sdk_version VARCHAR(32), 
	tags JSON NOT NULL, 
	user_metadata JSON NOT NULL, 
	created_at DATETIME NOT NULL, 
	last_heartbeat DATETIME NOT NULL, 
	finished_at DATETIME, 
	finish_reason VARCHAR(32), 
	project_id VARCHAR(128), 
	display_name VARCHAR(256), 
	PRIMARY KEY (session_id)
);
INSERT INTO "sessions" VALUES('s1','tml-alice','0.38.0','["a"]','{"k": "v"}','2026-11-24 09:30:00.000000','2026-11-24 09:30:00.000000',NULL,NULL,'p1','first');
INSERT INTO "sessions" VALUES('s2','tml-bob','0.38.0','[]','{}','2026-11-24 09:30:00.000000','2026-11-24 09:30:00.000000','2026-11-25 16:12:27.692487','success',NULL,NULL);
CREATE TABLE training_runs (
	run_id VARCHAR(128) NOT NULL, 
	session_id VARCHAR(64) NOT NULL, 
	owner VARCHAR(64) NOT NULL, 
	base_model VARCHAR(256) NOT NULL, 
	lora_rank INTEGER NOT NULL, 
	lora_config JSON NOT NULL, 
	user_metadata JSON, 
	created_at DATETIME NOT NULL, 
	last_request_time DATETIME NOT NULL, 
	corrupted BOOLEAN NOT NULL, 
	PRIMARY KEY (run_id), 
	FOREIGN KEY(session_id) REFERENCES sessions (session_id)
);
INSERT INTO "training_runs" VALUES('s1:train:0','s1','tml-alice','tiny-qwen3',8,'{"rank": 8, "seed": 0, "train_unembed": true, "train_mlp": true, "train_attn": true}','{"note": "x"}','2026-11-24 09:30:00.000000','2026-11-24 09:30:00.000000',0);
CREATE INDEX ix_sessions_owner ON sessions (owner);
CREATE INDEX ix_training_runs_session_id ON training_runs (session_id);
CREATE INDEX ix_training_runs_owner ON training_runs (owner);
CREATE INDEX ix_sampling_sessions_owner ON sampling_sessions (owner);
CREATE INDEX ix_sampling_sessions_session_id ON sampling_sessions (session_id);
CREATE INDEX ix_checkpoints_expires_at ON checkpoints (expires_at);
CREATE INDEX ix_checkpoints_owner ON checkpoints (owner);
