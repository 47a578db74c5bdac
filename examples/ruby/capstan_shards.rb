# Capstan::Shards: pushes from a Ruby app to a sharded capstan fleet (a
# shards: list in capstan.yml: several complete Sidekiq-format Redis
# servers), each job to the shard capstan's C client and `capstan push`
# pick for it, by the same rule:
#
#   1. the shard the caller names (shard:);
#   2. else the queue's home shard (home:, as a shard's queues: list);
#   3. else, among the shards home: does not name (those fetch every queue,
#      as a shard without a queues: list), the rendezvous pick (the highest
#      mix of Zlib.crc32 of "name:key", the first shard on a tie) of the job's
#      uniqueness digest when its class has a lock (sidekiq_options
#      lock: ..., so that its duplicates meet in one shard, where its lock
#      is taken), else of its jid (so that one busy queue spreads over them).
#
# home: is capstan.yml's queues: lists turned around: { queue => the first
# shard that lists it }, and a shard named there fetches its home queues
# only.
#
#   require 'capstan_shards'
#   Capstan::Shards.configure(
#     shards: { 'a' => { url: 'redis://r1:6379/0' },          # options for a pool,
#               'b' => ConnectionPool.new { ... },             # or a pool of your own
#               'c' => { url: 'redis://r3:6379/0', size: 10 } },
#     home: { 'reports' => 'b' })
#   jid, shard = Capstan::Shards.push(ReportJob, 42)            # routed
#   Capstan::Shards.push(ReportJob, 42, shard: 'c', queue: 'low')
#   item = { 'class' => ReportJob, 'args' => [42] }
#   Sidekiq::Client.via(Capstan::Shards.via_for(item)) { Sidekiq::Client.push(item) }
#
# The digest is sidekiq-unique-jobs v9's, as capstan computes it: the
# sorted [key, value] pairs of apartment (when set), class (unless
# unique_across_workers), lock_args (the class's lock_args method, else
# args) and queue (unless unique_across_queues), as JSON, hashed with MD5
# (SHA3-256 with configure(digest: :modern) or v9's digest_algorithm
# :modern), prefixed with lock_prefix (default "uniquejobs"). The lock
# itself is taken by the app's own client middleware (v9's), in the shard
# the push goes to.
#
# Works on Sidekiq 6.x, 7.x and 8.x. Shard names and the order of shards:
# must be those of capstan.yml's shards: list, or Ruby and C disagree.
require 'digest'
require 'json'
require 'openssl'
require 'securerandom'
require 'zlib'
require 'sidekiq'

module Capstan
  module Shards
    # v9's lock type names (and their aliases): another value is no lock.
    LOCKS = %w[until_executing while_enqueued until_executed until_completed until_performed
               until_processed until_successfully_completed until_expired while_executing
               while_busy around_perform while_working while_executing_reject
               until_and_while_executing].freeze

    class << self
      # shards: { name => pool or options for Sidekiq::RedisConnection.create },
      # in capstan.yml's order; home: { queue => shard name }; digest:
      # :legacy (MD5) or :modern (SHA3-256), default v9's setting if loaded.
      def configure(shards:, home: {}, digest: nil)
        raise ArgumentError, 'Capstan::Shards: shards: needs at least one shard' if shards.empty?

        names = shards.keys.map(&:to_s)
        home = home.to_h { |q, s| [q.to_s, s.to_s] }
        home.each_value { |s| known!(names, s) }
        @names = names.freeze
        @home = home.freeze
        @open = (names - home.values).freeze
        @digest = digest
        @pools = shards.to_h { |n, v| [n.to_s, v.is_a?(Hash) ? Sidekiq::RedisConnection.create(v) : v] }.freeze
        self
      end

      def names
        @names or raise 'Capstan::Shards.configure has not been called'
      end

      # The shard name's pool.
      def pool(name)
        names
        @pools.fetch(known!(@names, name.to_s))
      end

      # MurmurHash3's 32-bit finalizer: a CRC alone is linear, and its raw
      # scores would let one shard win far more keys than its share.
      def mix(h)
        h ^= h >> 16
        h = (h * 0x85ebca6b) & 0xffffffff
        h ^= h >> 13
        h = (h * 0xc2b2ae35) & 0xffffffff
        h ^ (h >> 16)
      end

      # The rendezvous pick of key among the shards that fetch every queue
      # (among names, when given).
      def pick(key, among = @open)
        names
        best = nil
        top = -1
        among.each do |n|
          h = mix(Zlib.crc32("#{n}:#{key}"))
          if h > top
            top = h
            best = n
          end
        end
        best
      end

      # The name of the shard item (a Sidekiq job hash: class, args, and
      # maybe queue, jid) goes to. A routing by jid needs one: give the
      # item a jid first (via_for does).
      def shard_for(item, shard: nil)
        names
        return known!(@names, shard.to_s) if shard

        opts = options(item)
        home = @home[opts['queue']]
        return home if home
        if @open.empty?
          raise ArgumentError, "Capstan::Shards: no shard fetches queue #{opts['queue']}: every shard " \
                               'is the home of other queues'
        end

        d = digest(opts)
        return pick(d) if d

        jid = item['jid'] || item[:jid] or raise ArgumentError, 'Capstan::Shards: the item has no jid to route by'
        pick(jid)
      end

      # The pool for Sidekiq::Client.via that item goes to; gives item a
      # jid when it has none, so that Sidekiq pushes it with the jid it
      # was routed by.
      def via_for(item, shard: nil)
        item['jid'] ||= SecureRandom.hex(12) unless item[:jid]
        pool(shard_for(item, shard: shard))
      end

      # Pushes one job of job_class; returns [jid, shard name], jid nil
      # when a client middleware refused it (a lock held).
      def push(job_class, *args, shard: nil, queue: nil)
        item = { 'class' => job_class, 'args' => args }
        item['queue'] = queue.to_s if queue
        name = shard_for(item.merge!('jid' => SecureRandom.hex(12)), shard: shard)
        [Sidekiq::Client.via(@pools.fetch(name)) { Sidekiq::Client.push(item) }, name]
      end

      # The v9 digest of item (its class's options filled in), or nil when
      # it has no lock.
      def digest(item)
        opts = options(item)
        return nil unless LOCKS.include?(opts['lock'].to_s.delete_prefix(':'))

        h = {}
        h['apartment'] = opts['apartment'] if opts.key?('apartment')
        h['class'] = opts['class'].to_s unless opts['unique_across_workers'] == true
        h['lock_args'] = lock_args(opts)
        h['queue'] = opts['queue'] unless opts['unique_across_queues'] == true
        json = JSON.generate(h.sort)
        hex = modern? ? OpenSSL::Digest.new('SHA3-256').hexdigest(json) : Digest::MD5.hexdigest(json)
        prefix = opts['lock_prefix'].to_s
        prefix = v9_config(:lock_prefix) || 'uniquejobs' if prefix.empty?
        "#{prefix}:#{hex}"
      end

      private

      def known!(names, name)
        return name if names.include?(name)

        raise ArgumentError, "Capstan::Shards: no shard named #{name.inspect} (the shards: #{names.join(', ')})"
      end

      # item with string keys over its class's sidekiq_options, as
      # Sidekiq's client merges them, and the queue Sidekiq would use.
      def options(item)
        item = item.transform_keys(&:to_s)
        cls = item['class']
        cls = Object.const_get(cls) if cls.is_a?(String) && Object.const_defined?(cls)
        defaults = cls.respond_to?(:get_sidekiq_options) ? cls.get_sidekiq_options : {}
        opts = defaults.transform_keys(&:to_s).merge(item)
        opts['queue'] = (opts['queue'] || 'default').to_s
        opts['lock'] = opts['lock'].to_s if opts['lock'].is_a?(Symbol)
        opts['class_ref'] = cls
        opts
      end

      # v9's lock args: what the class's lock_args_method (a method name or
      # a proc, default lock_args) makes of args, else args.
      def lock_args(opts)
        return opts['lock_args'] if opts.key?('lock_args') && opts['lock_args'].is_a?(Array)

        cls = opts['class_ref']
        meth = opts['lock_args_method'] || :lock_args
        args = opts['args'] || []
        return meth.call(args) if meth.respond_to?(:call)
        return cls.send(meth, args) if cls.respond_to?(meth)

        args
      end

      def modern?
        alg = @digest || v9_config(:digest_algorithm)
        alg.to_s == 'modern'
      end

      def v9_config(key)
        return nil unless defined?(SidekiqUniqueJobs) && SidekiqUniqueJobs.respond_to?(:config)

        SidekiqUniqueJobs.config.respond_to?(key) ? SidekiqUniqueJobs.config.public_send(key) : nil
      end
    end
  end
end
