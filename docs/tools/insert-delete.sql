-- INSERT and DELETE scenarios (issue 20) for docs/tools/instructions-extra.sh; see insert-delete.scen.
create table pi(id int primary key, v bigint not null default 0, tok bigint);
create table ti(id int primary key, v bigint not null default 0, tok bigint);
create table ri(id int primary key, r int not null, v bigint not null default 0, tok bigint);
create table pd(id int primary key, v bigint not null default 0, tok bigint);
create table td(id int primary key, v bigint not null default 0, tok bigint);
create table rd(id int primary key, r int not null, v bigint not null default 0, tok bigint);
create sequence si start 1000000; create sequence sp; create sequence st; create sequence sr;
select fence.protect('ti','tw','tok'); select fence.protect('td','tw','tok');
select fence.protect_rows('ri','r','row:','tok'); select fence.protect_rows('rd','r','row:','tok');
insert into pd select g,0,1 from generate_series(1,1000) g;
insert into td select g,0,:tok from generate_series(1,1000) g;
insert into rd select g,1,0,(select tok from toks where id = 1) from generate_series(1,1000) g;
